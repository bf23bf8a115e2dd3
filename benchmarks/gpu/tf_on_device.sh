#!/usr/bin/env bash
# On the GPU machine, after ../shared/gpu_tf's device_setup.sh (TensorFlow 2.16.2 in /tmp/site):
# builds the op library with its GPU kernels against that TensorFlow, runs the single-process
# test suite (the ops on the GPU wherever TensorFlow places them; tests/test_devices.py on
# both devices), rebuilds and re-runs the C ABI GPU tests, then the TF-on-GPU benchmarks.
# Logs and JSON land in $OUT (default benchmarks/results).
set -uo pipefail
cd "$(dirname "$0")/../.."
export OUT=${OUT:-benchmarks/results} PYTHONUNBUFFERED=1
source .ferry/bin/env.sh
export PYTHONPATH=$PWD:$PYTHONPATH
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/tf_gpu_device.txt"
SOK_BUILD_CUDA=1 SOK_CUDA_ARCHS=90 python3 scripts/build_plugin.py > "$OUT/tf_gpu_build.log" 2>&1 \
  || { tail -40 "$OUT/tf_gpu_build.log"; exit 1; }
python3 -c "import tensorflow as tf, sparse_operation_kit as sok; print('TF', tf.__version__, tf.config.list_physical_devices('GPU'))"
timeout ${TEST_TIMEOUT:-400} python3 -m pytest -q -x --timeout 300 -p no:cacheprovider ${TESTS:-tests/test_devices.py} 2>&1 \
  | tee "$OUT/tf_gpu_tests.log" | tail -25
if [ -n "${FULL_SUITE:-}" ]; then
  timeout 400 python3 -m pytest -q --timeout 300 -p no:cacheprovider tests --ignore=tests/gpu \
    --ignore=tests/test_multiworker.py --ignore=tests/test_devices.py 2>&1 \
    | tee "$OUT/tf_gpu_suite.log" | tail -25
fi
if [ -n "${CAPI:-}" ]; then
  cmake -S . -B build-gpu -G Ninja -DSOK_BUILD_TF=OFF -DSOK_BUILD_CUDA=ON \
    -DCMAKE_CUDA_ARCHITECTURES=90 -DSOK_OUTPUT_DIR="$PWD/build-gpu/lib" > "$OUT/capi_build.log" 2>&1 \
    && cmake --build build-gpu >> "$OUT/capi_build.log" 2>&1 || tail -20 "$OUT/capi_build.log"
  env -u PYTHONPATH -u LD_LIBRARY_PATH python3 -m pytest -q --noconftest -p no:cacheprovider \
    tests/gpu 2>&1 | tee "$OUT/gpu_tests.log" | tail -5
fi
[ -n "${BENCH:-}" ] && timeout 500 python3 benchmarks/gpu/tf_gpu.py 2>&1 | tee "$OUT/tf_gpu_bench.log" | tail -30
exit 0
