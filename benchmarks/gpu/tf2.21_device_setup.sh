#!/usr/bin/env bash
# Usage, ON THE GPU MACHINE from the repository root: tf2.21_device_setup.sh PARTS [--horovod]
# PARTS: one folder holding the files of every part tf2.21_prepare.sh made. Installs TensorFlow
# 2.21.0 (GPU build,
# Keras 3 and tf_keras) into /tmp/site2.21 beside the image's NumPy 2, gives the image's CUDA 13
# libraries the CUDA 12 names TensorFlow loads (cuBLAS, cuBLASLt, cuFFT, cuSOLVER, cuSPARSE,
# cuDNN 9: the real libraries, no stubs, so convolutions and XLA run), and writes
# /tmp/env2.21.sh to source before each command. With --horovod it builds Horovod 0.28.1 with
# NCCL against it (its XLA ops left out, as scripts/setup_env.sh does for 2.17 and later;
# its GPU ops read TF 2.21's stream handle).
set -euo pipefail
R=$PWD
PARTS=$(cd "${1:?usage: tf2.21_device_setup.sh PARTS [--horovod]}" && pwd)
SITE=/tmp/site2.21
TFW=$(awk '{print $2}' "$PARTS/tf.md5")
(cd "$PARTS" && cat tfw.? > /tmp/"$TFW" \
  && cd /tmp && md5sum -c "$PARTS/tf.md5")
python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target $SITE \
  /tmp/"$TFW" "$PARTS"/*.whl

# CUDA 13 libraries under the CUDA 12 names TensorFlow 2.21 opens (their C APIs are the same).
# cuDNN 9 keeps its name and comes from PyTorch's wheels.
LINKS=/tmp/cuda12_names
mkdir -p $LINKS
find_lib() { { find /usr/local/cuda/lib64/ /opt/torch/.venv/lib/python3.12/site-packages/nvidia/ \
  -name "$1" 2>/dev/null || true; } | head -1; }
for pair in libcublas.so.13:libcublas.so.12 libcublasLt.so.13:libcublasLt.so.12 \
    libcufft.so.12:libcufft.so.11 libcusolver.so.12:libcusolver.so.11 \
    libcusparse.so.12:libcusparse.so.12 libcudnn.so.9:libcudnn.so.9; do
  found=$(find_lib "${pair%%:*}")
  [ -n "$found" ] || { echo "no ${pair%%:*} on this machine" >&2; exit 1; }
  ln -sf "$found" "$LINKS/${pair##*:}"
done
CUDNN_DIR=$(dirname "$(find_lib libcudnn.so.9)")
NCCL_LIB=$(find_lib libnccl.so.2)
[ -n "$NCCL_LIB" ] || { echo "no libnccl.so.2 on this machine" >&2; exit 1; }
NCCL_DIR=$(dirname "$(dirname "$NCCL_LIB")")  # Horovod's build wants lib/libnccl.so beside it
[ -e $NCCL_DIR/lib/libnccl.so ] || ln -s $NCCL_DIR/lib/libnccl.so.2 $NCCL_DIR/lib/libnccl.so

# Keras 3 imports PyTorch and JAX where installed: hidden, so a TensorFlow process loads one
# CUDA stack.
for hidden in torch jax jaxlib; do
  mkdir -p /tmp/hidden2.21/$hidden
  echo "raise ImportError('$hidden is hidden from TensorFlow 2.21 here')" > /tmp/hidden2.21/$hidden/__init__.py
done
printf 'import sys\nfrom horovod.runner.launch import run_commandline\nif __name__ == "__main__":\n    sys.exit(run_commandline())\n' > $SITE/hvdrun.py

cat > /tmp/env2.21.sh <<EOF
export PYTHONPATH=$SITE:/tmp/hidden2.21\${PYTHONPATH:+:\$PYTHONPATH}
export LD_LIBRARY_PATH=$SITE/nvidia/cuda_runtime/lib:$LINKS:/usr/local/cuda/lib64:$CUDNN_DIR:$NCCL_DIR/lib\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}
export XLA_FLAGS=--xla_gpu_cuda_data_dir=$SITE/nvidia/cuda_nvcc NCCL_DIR=$NCCL_DIR
export TF_CPP_MIN_LOG_LEVEL=\${TF_CPP_MIN_LOG_LEVEL:-2} PYTHONUNBUFFERED=1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
unset TF_USE_LEGACY_KERAS
horovodrun() { python3 $SITE/hvdrun.py "\$@"; }
export -f horovodrun
EOF
source /tmp/env2.21.sh
python3 -c "
import tensorflow as tf, keras, numpy
g = tf.config.list_physical_devices('GPU')
print('TF', tf.__version__, 'Keras', keras.__version__, 'NumPy', numpy.__version__, 'GPUs', len(g))
assert g
print('cuDNN', tf.sysconfig.get_build_info().get('cudnn_version'), 'conv', float(tf.reduce_sum(tf.nn.conv2d(tf.ones([1, 8, 8, 4]), tf.ones([3, 3, 4, 2]), 1, 'SAME'))))
print('XLA', float(tf.function(lambda x: tf.reduce_sum(x * x), jit_compile=True)(tf.ones([1024]))))"

if [ "${2:-}" = "--horovod" ]; then
  cd /tmp && rm -rf horovod-0.28.1 && tar xzf "$PARTS/horovod-0.28.1.tar.gz" && cd horovod-0.28.1
  sed -i '/xla_mpi_ops.cc/d' horovod/tensorflow/CMakeLists.txt
  # TensorFlow 2.21 no longer exports stream_executor::gpu::AsGpuStreamValue, which Horovod's
  # GPU ops declare and call: a template in its place reads the stream's handle (instantiated
  # where Stream is complete).
  sed -i 's|^GpuStreamHandle AsGpuStreamValue(Stream\* stream);|template <typename S> GpuStreamHandle AsGpuStreamValue(S* stream) { return static_cast<GpuStreamHandle>(stream->platform_specific_handle().stream); }|' \
    horovod/tensorflow/mpi_ops.cc
  grep -q "template <typename S> GpuStreamHandle" horovod/tensorflow/mpi_ops.cc
  export CXXFLAGS="-include string -include cstdint -include stdexcept" CMAKE_POLICY_VERSION_MINIMUM=3.5
  HOROVOD_WITH_TENSORFLOW=1 HOROVOD_WITHOUT_PYTORCH=1 HOROVOD_WITHOUT_MXNET=1 HOROVOD_WITHOUT_MPI=1 \
  HOROVOD_WITH_GLOO=1 HOROVOD_GPU_OPERATIONS=NCCL HOROVOD_NCCL_INCLUDE=$NCCL_DIR/include \
  HOROVOD_NCCL_LIB=$NCCL_DIR/lib HOROVOD_NCCL_LINK=SHARED HOROVOD_CUDA_HOME=/usr/local/cuda \
  HOROVOD_BUILD_CUDA_CC_LIST=90 MAKEFLAGS=-j$(nproc) \
    python3 -m pip install -q --no-build-isolation --no-deps --no-index --target $SITE . > /tmp/horovod2.21_build.log 2>&1 \
    || { tail -30 /tmp/horovod2.21_build.log; exit 1; }
  cd "$R" && python3 -c "import horovod.tensorflow as hvd; hvd.init(); print('Horovod', hvd.size(), 'NCCL', hvd.nccl_built())"
fi
echo "tf2.21_device_setup done: source /tmp/env2.21.sh"
