#!/usr/bin/env bash
# On the GPU machine (CUDA, PyTorch, CMake; no TensorFlow): build the C ABI library, run the
# GPU tests, run the GPU benchmarks. Results land in $OUT (default benchmarks/results).
set -euo pipefail
cd "$(dirname "$0")/../.."
export OUT=${OUT:-benchmarks/results}
cmake -S . -B build-gpu -G Ninja -DSOK_BUILD_TF=OFF -DSOK_BUILD_CUDA=ON \
  -DCMAKE_CUDA_ARCHITECTURES=90 -DSOK_OUTPUT_DIR="$PWD/build-gpu/lib" > "$OUT/build.log" 2>&1 \
  || { tail -30 "$OUT/build.log"; exit 1; }
cmake --build build-gpu >> "$OUT/build.log" 2>&1 || { tail -30 "$OUT/build.log"; exit 1; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
if python -c "import pytest" 2>/dev/null; then
  python -m pytest -q --noconftest tests/gpu 2>&1 | tee "$OUT/gpu_tests.log" | tail -5
else
  echo "pytest missing: GPU tests not run" | tee "$OUT/gpu_tests.log"
fi
python benchmarks/gpu/g5_interaction.py
python benchmarks/gpu/g3_pooled.py
python benchmarks/gpu/sparse_adam.py
