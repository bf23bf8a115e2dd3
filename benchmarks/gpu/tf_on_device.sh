#!/usr/bin/env bash
# One GPU: builds the op library with its GPU kernels against the installed TensorFlow, runs
# tests/test_devices.py and tests/test_dynamic_devices.py (every test on CPU and GPU), then the
# rest of the single-process suite with the ops and tables wherever TensorFlow places them (the
# GPU), then the TF-on-GPU benchmarks (static: tf_gpu.py, dynamic: tf_gpu_dynamic.py).
# Needs: python3 with a GPU build of TensorFlow (2.15, or 2.16 with tf_keras and
# TF_USE_LEGACY_KERAS=1), numpy < 2 and pytest; nvcc >= 12, cmake and a C++17 compiler on PATH;
# SOK_CUDA_ARCHS (default 90) names the compute capabilities to build.
# Logs and JSON land in $OUT (default benchmarks/out). CAPI=1 also rebuilds and runs the C ABI
# GPU tests (tests/gpu, needs PyTorch), SKIP_BENCH=1 skips the benchmarks, BENCH=dynamic (or
# static) runs one set only.
set -uo pipefail
cd "$(dirname "$0")/../.."
export OUT=${OUT:-benchmarks/out} PYTHONUNBUFFERED=1
mkdir -p "$OUT"
export PYTHONPATH=$PWD:$PYTHONPATH
NOISE="Unable to register\|C-API\|importlib\|DeprecationWarning\|_pytest/\|pluggy/\|Extension modules"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/tf_gpu_device.txt"
SOK_BUILD_CUDA=1 SOK_CUDA_ARCHS=${SOK_CUDA_ARCHS:-90} python3 scripts/build_plugin.py > "$OUT/tf_gpu_build.log" 2>&1 \
  || { tail -40 "$OUT/tf_gpu_build.log"; exit 1; }
tail -2 "$OUT/tf_gpu_build.log"
echo "== tests/test_devices.py tests/test_dynamic_devices.py (CPU and GPU)" | tee "$OUT/tf_gpu_tests.log"
timeout 500 python3 -m pytest -q -rf --tb=short -p no:cacheprovider tests/test_devices.py \
  tests/test_dynamic_devices.py 2>&1 \
  | grep -v "$NOISE" >> "$OUT/tf_gpu_tests.log"
tail -3 "$OUT/tf_gpu_tests.log"
# The rest of the suite, but the multi-worker tests (multi_gpu_on_device.sh runs them on
# several GPUs) and the C ABI tests (PyTorch, below).
echo "== the single-process suite, ops placed by TensorFlow (the GPU)" | tee "$OUT/tf_gpu_suite.log"
timeout 500 python3 -m pytest -q -rf --tb=line -p no:cacheprovider tests --ignore=tests/gpu \
  --ignore=tests/test_devices.py --ignore=tests/test_dynamic_devices.py \
  --ignore=tests/test_multiworker.py 2>&1 \
  | grep -v "$NOISE" >> "$OUT/tf_gpu_suite.log"
tail -3 "$OUT/tf_gpu_suite.log"
if [ -n "${CAPI:-}" ]; then
  cmake -S . -B build-gpu -G Ninja -DSOK_BUILD_TF=OFF -DSOK_BUILD_CUDA=ON \
    -DCMAKE_CUDA_ARCHITECTURES=${SOK_CUDA_ARCHS:-90} -DSOK_OUTPUT_DIR="$PWD/build-gpu/lib" > "$OUT/capi_build.log" 2>&1 \
    && cmake --build build-gpu >> "$OUT/capi_build.log" 2>&1 || tail -20 "$OUT/capi_build.log"
  env -u PYTHONPATH -u LD_LIBRARY_PATH python3 -m pytest -q --noconftest -p no:cacheprovider \
    tests/gpu 2>&1 | tee "$OUT/gpu_tests.log" | tail -3
fi
if [ -z "${SKIP_BENCH:-}" ] && [ "${BENCH:-static}" = static ]; then
  timeout 500 python3 benchmarks/gpu/tf_gpu.py 2>&1 | grep -v "$NOISE" > "$OUT/tf_gpu_bench.log"
  grep "^T\|^G" "$OUT/tf_gpu_bench.log" | cut -c1-300
fi
if [ -z "${SKIP_BENCH:-}" ] && [ "${BENCH:-dynamic}" = dynamic ]; then
  timeout 300 python3 benchmarks/gpu/tf_gpu_dynamic.py 2>&1 | grep -v "$NOISE" \
    > "$OUT/tf_gpu_dynamic_bench.log"
  grep "^T\|^G\|Error" "$OUT/tf_gpu_dynamic_bench.log" | cut -c1-400
fi
exit 0
