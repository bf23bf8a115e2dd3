#!/usr/bin/env bash
# The C ABI harness on one GPU (no TensorFlow): builds libsok_capi.so, runs its GPU tests
# (tests/capi) and the GPU benchmarks against PyTorch in the same process (G3, G5, sparse Adam).
# Needs: python with PyTorch (CUDA) and pytest, nvcc >= 12, cmake and ninja on PATH;
# SOK_CUDA_ARCHS (default 90). Results land in $OUT (default benchmarks/out).
set -euo pipefail
cd "$(dirname "$0")/../.."
export OUT=${OUT:-benchmarks/out}
mkdir -p "$OUT"
cmake -S . -B build-gpu -G Ninja -DSOK_BUILD_TF=OFF -DSOK_BUILD_CUDA=ON \
  -DCMAKE_CUDA_ARCHITECTURES=${SOK_CUDA_ARCHS:-90} -DSOK_OUTPUT_DIR="$PWD/build-gpu/lib" > "$OUT/build.log" 2>&1 \
  || { tail -30 "$OUT/build.log"; exit 1; }
cmake --build build-gpu >> "$OUT/build.log" 2>&1 || { tail -30 "$OUT/build.log"; exit 1; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
if python -c "import pytest" 2>/dev/null; then
  python -m pytest -q --noconftest tests/capi 2>&1 | tee "$OUT/gpu_tests.log" | tail -5
else
  echo "pytest missing: GPU tests not run" | tee "$OUT/gpu_tests.log"
fi
python benchmarks/gpu/g5_interaction.py
python benchmarks/gpu/g3_pooled.py
python benchmarks/gpu/sparse_adam.py
python benchmarks/run.py --results "$OUT" || true  # degraded figures are reported, not fatal
