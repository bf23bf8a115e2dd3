#!/usr/bin/env bash
# The drop-in check on one GPU: tests/sok_dropin/sok_script.py under NVIDIA's SOK 2.1.0 and
# under this package, each in its own process (PYTHONPATH choosing the package), then
# compare.py. STAGES (default "build run"):
#   build  builds this package's op library with its GPU kernels
#   run    runs the script under both packages (with its speed sections) and compares
# Needs: python3 with GPU TensorFlow 2.16 (tf_keras, TF_USE_LEGACY_KERAS=1) and Horovod with
# NCCL; NVIDIA's SOK (merlin-sok 2.1.0) built for the GPU, as a tarball of its
# sparse_operation_kit/ package at $SOK_DIST (default .peers/sok_dist.tar.gz); nvcc and cmake
# for the build. Logs and JSON land in $OUT (default
# benchmarks/out): sok_dropin.json is the comparison.
set -uo pipefail
cd "$(dirname "$0")/../.."
export OUT=${OUT:-benchmarks/out} PYTHONUNBUFFERED=1 TF_CPP_MIN_LOG_LEVEL=2
STAGES=${STAGES:-build run}
mkdir -p "$OUT/sok_dropin"
if [[ $STAGES == *build* ]]; then
  SOK_BUILD_CUDA=1 SOK_CUDA_ARCHS=${SOK_CUDA_ARCHS:-90} python3 scripts/build_plugin.py \
    > "$OUT/sok_dropin_build.log" 2>&1 || { tail -30 "$OUT/sok_dropin_build.log"; exit 1; }
  PYTHONPATH=$PWD:$PYTHONPATH python3 -m sparse_operation_kit.info 2>/dev/null | tail -4
fi
if [[ $STAGES == *run* ]]; then
  rm -rf /tmp/realsok && mkdir -p /tmp/realsok && tar xzf "${SOK_DIST:-.peers/sok_dist.tar.gz}" -C /tmp/realsok
  # SOK's libraries need CUDA's libcurand, which is not on the default path there
  export LD_LIBRARY_PATH=/usr/local/cuda-13.0/targets/x86_64-linux/lib:/usr/local/cuda/targets/x86_64-linux/lib:$LD_LIBRARY_PATH
  for package in sok ours; do
    root=$([ $package = sok ] && echo /tmp/realsok || echo "$PWD")
    PYTHONPATH=$root:$PYTHONPATH timeout 280 python3 tests/sok_dropin/sok_script.py \
      "$OUT/sok_dropin" $package ${SPEED:---speed} > "$OUT/sok_dropin/$package.log" 2>&1
    echo "== $package (exit $?)"; grep -v "Warning\|warn(" "$OUT/sok_dropin/$package.log" | grep ": \|WROTE" | tail -40
  done
  python3 tests/sok_dropin/compare.py "$OUT/sok_dropin" "$OUT/sok_dropin.json"
fi
