#!/usr/bin/env bash
# Two or more GPUs: builds the op library with its GPU kernels, then, by STAGES (default
# "tests bench dlrm"):
#   tests  tests/multiworker/test_multiworker.py on 2 GPUs (SOK_TEST_EXPECT_GPU=1: tables on each worker's
#          GPU, exchanges through NCCL), every multi-worker test against its reference
#   suite  the single-process tests that start Horovod jobs or child processes (DLRM smoke,
#          two-worker checkpoints, SOK's scripts, SavedModel serving), with the GPUs in view
#   bench  benchmarks/gpu/tf_multi_gpu.py (G6, G6x) and torch_a2a.py (PyTorch's NCCL
#          all-to-all at the same sizes), combined into tf_multi_gpu.json
#   dlrm   tutorials/DLRM_Benchmark/main.py on 2 GPUs: generated Criteo-format data on 2 GPUs
#          and on the CPUs (the same data, for the AUC), synthetic data for samples/s against
#          Keras tables on one GPU
# Needs: python3 with a GPU build of TensorFlow (2.15, or 2.16 with tf_keras and
# TF_USE_LEGACY_KERAS=1, or 2.21 as tf2.21_device_setup.sh --horovod installs it), NumPy < 2
# below 2.18, and pytest; nvcc >= 12, cmake and a C++17 compiler on PATH;
# SOK_CUDA_ARCHS (default 90) names the compute capabilities to build.
# Also Horovod built with NCCL and TensorFlow (`horovodrun` on PATH), NCCL's libnccl.so.2 on
# LD_LIBRARY_PATH, and for the bench stage PyTorch (its all-to-all is the competitor).
# Logs and JSON land in $OUT (default benchmarks/out).
set -uo pipefail
source "$(dirname "$0")/device_prologue.sh"
STAGES=${STAGES:-tests bench dlrm}
NOISE="Unable to register\|C-API\|importlib\|DeprecationWarning\|_pytest/\|pluggy/\|Extension modules\|cpu_feature_guard\|rebuild TensorFlow"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/tf_multi_gpu_device.txt"
start=$(date +%s)
build_plugin "$OUT/tf_multi_gpu_build.log"
echo "build: $(( $(date +%s) - start )) s"

if [[ $STAGES == *tests* ]]; then
  echo "== tests/multiworker/test_multiworker.py on 2 GPUs" | tee "$OUT/tf_multi_gpu_tests.log"
  SOK_TEST_EXPECT_GPU=1 timeout 540 python3 -m pytest -q -rf --tb=short -p no:cacheprovider \
    tests/multiworker/test_multiworker.py 2>&1 | grep -v "$NOISE" >> "$OUT/tf_multi_gpu_tests.log"
  tail -4 "$OUT/tf_multi_gpu_tests.log"
fi

if [[ $STAGES == *suite* ]]; then
  echo "== child-process and Horovod tests of the suite, GPUs in view" | tee "$OUT/tf_multi_gpu_suite.log"
  timeout 400 python3 -m pytest -q -rf --tb=short -p no:cacheprovider tests/dlrm/test_dlrm_smoke.py \
    tests/checkpoints/test_checkpoint_files.py tests/optimizers/test_optimizer_surface.py tests/package/test_sok_surface.py \
    tests/dynamic/test_dynamic_variable_api.py tests/package/test_readme.py 2>&1 | grep -v "$NOISE" \
    >> "$OUT/tf_multi_gpu_suite.log"
  tail -8 "$OUT/tf_multi_gpu_suite.log"
fi

if [[ $STAGES == *bench* ]]; then
  timeout 400 bash -c "$(declare -f horovodrun); horovodrun -np 2 -H localhost:2 --gloo python3 benchmarks/gpu/tf_multi_gpu.py" 2>&1 \
    | grep -v "$NOISE" > "$OUT/tf_multi_gpu_bench.log"
  grep "^G6\|^exchange\|Error" "$OUT/tf_multi_gpu_bench.log" | cut -c1-600
  env -u PYTHONPATH -u LD_LIBRARY_PATH timeout 120 python3 -m torch.distributed.run \
    --nproc_per_node 2 benchmarks/gpu/torch_a2a.py 2>&1 | grep "^torch\|Error" | tee -a "$OUT/tf_multi_gpu_bench.log"
fi

if [[ $STAGES == *dlrm* ]]; then
  dlrm_begin "$OUT/tf_multi_gpu_dlrm.log"
  dlrm "AUC, generated data, 2 GPUs (TF32 matmuls)" bash -c "run_h 2 $AUC_FLAGS"
  dlrm "AUC, generated data, the same job on the CPUs" CUDA_VISIBLE_DEVICES= bash -c "run_h 2 $AUC_FLAGS"
  SYN="--use_synthetic_dataset --synthetic_steps 60 --optimizer adam --lr 0.001 --custom_interact --log_interval 20 --synthetic_vocab criteo_tb"
  dlrm "synthetic criteo_tb (4M cap), sok tables, 2 GPUs, global batch 65536, --compress" bash -c "run_h 2 $SYN --global_batch_size 65536 --compress"
  dlrm "synthetic criteo_tb (4M cap), sok tables, 2 GPUs, global batch 65536, --amp" bash -c "run_h 2 $SYN --global_batch_size 65536 --amp"
  dlrm "synthetic criteo_tb (4M cap), Keras tables replicated, 2 GPUs, global batch 65536, --compress" bash -c "run_h 2 $SYN --global_batch_size 65536 --compress --embedding keras"
  dlrm "synthetic criteo_tb (4M cap), Keras tables, 1 GPU, batch 32768" bash -c "run_h 1 $SYN --global_batch_size 32768 --embedding keras"
  dlrm "synthetic criteo_tb (4M cap), Keras tables, 1 GPU, batch 32768, --amp" bash -c "run_h 1 $SYN --global_batch_size 32768 --embedding keras --amp"
fi
[ -f "$OUT/tf_multi_gpu_tf.json" ] && [ -f "$OUT/tf_multi_gpu_torch.json" ] && [ -f "$OUT/tf_multi_gpu_dlrm.log" ] \
  && python3 benchmarks/gpu/combine_multi_gpu.py "$OUT" > /dev/null \
  && python3 benchmarks/run.py --results "$OUT"
exit 0
