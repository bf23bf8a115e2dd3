# Sourced by tf_on_device.sh and multi_gpu_on_device.sh: works from the repository root, with
# $OUT (default benchmarks/out) made and the checkout first on PYTHONPATH.
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
export OUT=${OUT:-benchmarks/out} PYTHONUNBUFFERED=1
mkdir -p "$OUT"
export PYTHONPATH=$PWD:$PYTHONPATH

# KERAS3_WHEELS, a folder of Keras 3's wheels and its dependencies' for the machine's Python
# (pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp
# --platform manylinux_2_17_x86_64 keras==3.15.1 namex optree rich markdown-it-py mdurl
# pygments h5py): they are installed under /tmp/keras3, tf.keras is Keras 3 (no
# TF_USE_LEGACY_KERAS), and the logs' names end in _keras3.
KERAS_TAG=""
if [ -n "${KERAS3_WHEELS:-}" ]; then
  python3 -m pip install -q --no-deps --target /tmp/keras3 "$KERAS3_WHEELS"/*.whl || exit 1
  # Keras 3 imports PyTorch and JAX where installed; the machine's are built for NumPy 2 and
  # fail beside this TensorFlow's NumPy 1, so they are hidden from it.
  for hidden in torch jax jaxlib; do
    mkdir -p /tmp/keras3_hidden/$hidden
    echo "raise ImportError('$hidden is hidden from Keras 3 here')" > /tmp/keras3_hidden/$hidden/__init__.py
  done
  export PYTHONPATH=/tmp/keras3:/tmp/keras3_hidden:$PYTHONPATH
  unset TF_USE_LEGACY_KERAS
  KERAS_TAG=_keras3
fi

# build_plugin LOG: the op library with its GPU kernels (SOK_CUDA_ARCHS, default 90); on a
# failed build, the log's tail and exit.
build_plugin() {
  SOK_BUILD_CUDA=1 SOK_CUDA_ARCHS=${SOK_CUDA_ARCHS:-90} python3 scripts/build_plugin.py > "$1" 2>&1 \
    || { tail -40 "$1"; exit 1; }
}
