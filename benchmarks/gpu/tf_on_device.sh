#!/usr/bin/env bash
# One GPU: builds the op library with its GPU kernels against the installed TensorFlow and
# prints its build report, then, by STAGES (default "tests suite bench"):
#   tests  tests/lookup, tests/dynamic/test_dynamic_devices.py, tests/dynamic/test_tiered_table.py,
#          tests/optimizers/test_static_apply.py and tests/models/test_interaction.py
#          (or $GPU_TESTS)
#          (every test on CPU and GPU)
#   suite  the rest of the single-process suite, ops and tables placed by TensorFlow (the GPU)
#   capi   the C ABI GPU tests (tests/capi, needs PyTorch)
#   bench  the TF-on-GPU benchmarks (BENCH=static: tf_gpu.py; BENCH=dynamic: tf_gpu_dynamic.py;
#          both by default; BENCH=tiered: tf_tiered.py with $TIERED_ARGS), then benchmarks/run.py's comparison with the baselines
#   dlrm   tutorials/DLRM_Benchmark/main.py on generated Criteo-format data, one worker: on
#          the GPU, on the GPU with --xla --amp, and the same job on the CPUs (the AUC to reach);
#          needs Horovod
# Needs: python3 with a GPU build of TensorFlow (2.15, or 2.16 with tf_keras and
# TF_USE_LEGACY_KERAS=1, or with Keras 3: KERAS3_WHEELS in device_prologue.sh; or 2.21 with
# Keras 3 or tf_keras: tf2.21_device_setup.sh), NumPy < 2 below 2.18, and pytest; nvcc >= 12, cmake and a C++17 compiler on PATH;
# SOK_CUDA_ARCHS (default 90) names the compute capabilities to build.
# Logs and JSON land in $OUT (default benchmarks/out).
set -uo pipefail
source "$(dirname "$0")/device_prologue.sh"
STAGES=${STAGES:-tests suite bench}
NOISE="Unable to register\|C-API\|importlib\|DeprecationWarning\|_pytest/\|pluggy/\|Extension modules"
build_plugin "$OUT/tf_gpu_build.log"
python3 -m sparse_operation_kit.info 2>/dev/null | tee -a "$OUT/tf_gpu_build.log"

if [[ $STAGES == *tests* ]]; then
  GPU_TESTS=${GPU_TESTS:-"tests/lookup tests/dynamic/test_dynamic_devices.py
    tests/dynamic/test_tiered_table.py tests/optimizers/test_static_apply.py
    tests/models/test_interaction.py"}
  echo "== "$GPU_TESTS" (CPU and GPU)" | tee "$OUT/tf_gpu_tests$KERAS_TAG.log"
  timeout 540 python3 -m pytest -q -rf --tb=short -p no:cacheprovider $GPU_TESTS 2>&1 \
    | grep -v "$NOISE" >> "$OUT/tf_gpu_tests$KERAS_TAG.log"
  tail -3 "$OUT/tf_gpu_tests$KERAS_TAG.log"
fi

if [[ $STAGES == *suite* ]]; then
  # The multi-worker tests run on several GPUs in multi_gpu_on_device.sh.
  echo "== the single-process suite, ops placed by TensorFlow (the GPU)" | tee "$OUT/tf_gpu_suite$KERAS_TAG.log"
  timeout 540 python3 -m pytest -q -rf --tb=line -p no:cacheprovider tests --ignore=tests/capi \
    --ignore=tests/lookup --ignore=tests/dynamic/test_dynamic_devices.py \
    --ignore=tests/dynamic/test_tiered_table.py --ignore=tests/optimizers/test_static_apply.py \
    --ignore=tests/models/test_interaction.py --ignore=tests/multiworker 2>&1 \
    | grep -v "$NOISE" >> "$OUT/tf_gpu_suite$KERAS_TAG.log"
  tail -3 "$OUT/tf_gpu_suite$KERAS_TAG.log"
fi

if [[ $STAGES == *capi* ]]; then
  cmake -S . -B build-gpu -G Ninja -DSOK_BUILD_TF=OFF -DSOK_BUILD_CUDA=ON \
    -DCMAKE_CUDA_ARCHITECTURES=${SOK_CUDA_ARCHS:-90} -DSOK_OUTPUT_DIR="$PWD/build-gpu/lib" > "$OUT/capi_build.log" 2>&1 \
    && cmake --build build-gpu >> "$OUT/capi_build.log" 2>&1 || tail -20 "$OUT/capi_build.log"
  env -u PYTHONPATH -u LD_LIBRARY_PATH python3 -m pytest -q --noconftest -p no:cacheprovider \
    tests/capi 2>&1 | tee "$OUT/gpu_tests.log" | tail -3
fi

if [[ $STAGES == *bench* ]]; then
  if [ "${BENCH:-static}" = static ]; then
    timeout 540 python3 benchmarks/gpu/tf_gpu.py 2>&1 | grep -v "$NOISE" > "$OUT/tf_gpu_bench.log"
    grep "^T\|^G" "$OUT/tf_gpu_bench.log" | cut -c1-300
  fi
  if [ "${BENCH:-dynamic}" = dynamic ]; then
    timeout 540 python3 benchmarks/gpu/tf_gpu_dynamic.py 2>&1 | grep -v "$NOISE" \
      > "$OUT/tf_gpu_dynamic_bench.log"
    grep "^T\|^G\|Error" "$OUT/tf_gpu_dynamic_bench.log" | cut -c1-400
  fi
  if [ "${BENCH:-}" = tiered ]; then  # TIERED_ARGS: tf_tiered.py's (variants, scale)
    timeout 540 python3 benchmarks/gpu/tf_tiered.py ${TIERED_ARGS:-} 2>&1 | grep -v "$NOISE" \
      > "$OUT/tf_tiered_bench.log"
    grep "^T\|Error" "$OUT/tf_tiered_bench.log" | cut -c1-1500
  fi
  python3 benchmarks/run.py --results "$OUT"
fi
if [[ $STAGES == *dlrm* ]]; then
  dlrm_begin "$OUT/tf_gpu_dlrm.log"
  dlrm "AUC, generated data, 1 GPU (TF32 matmuls)" bash -c "run_h 1 $AUC_FLAGS"
  dlrm "AUC, generated data, 1 GPU, --xla --amp" bash -c "run_h 1 $AUC_FLAGS --xla --amp"
  dlrm "AUC, generated data, the same job on the CPUs" CUDA_VISIBLE_DEVICES= bash -c "run_h 1 $AUC_FLAGS"
fi
exit 0
