#!/usr/bin/env bash
# T6 beside HierarchicalKV's hybrid mode, one GPU, one job, the same keys: builds the op
# library and benchmarks/gpu/t6_hkv_hybrid.cu, runs benchmarks/gpu/tf_tiered.py on VARIANTS
# (default T6a; TIERED_ARGS adds its options) writing each variant's batches, then
# HierarchicalKV on those batches, and merges its figures into tf_tiered.json ("hkv_hybrid",
# "vs_hkv_hybrid"). BUILD_ONLY=1 stops after the builds.
# Needs what tf_on_device.sh needs, and HKV_INCLUDE: the include folder of a HierarchicalKV
# checkout (github.com/NVIDIA-Merlin/HierarchicalKV), or HKV_BINARY: that program already
# built (nvcc takes about a minute over it). Results land in $OUT.
set -uo pipefail
source "$(dirname "$0")/device_prologue.sh"
NOISE="Unable to register\|C-API\|importlib\|DeprecationWarning"
VARIANTS=${VARIANTS:-T6a}
ROUNDS=${ROUNDS:-2}
KEYS_DIR=/tmp/t6_keys
mkdir -p "$KEYS_DIR"
build_plugin "$OUT/tf_gpu_build.log"
# Built once a source version (under /tmp, kept while the machine is).
HKV_BINARY=${HKV_BINARY:-/tmp/t6_hkv_hybrid_$(md5sum < benchmarks/gpu/t6_hkv_hybrid.cu | cut -c1-12)}
if [ ! -x "$HKV_BINARY" ]; then
  : "${HKV_INCLUDE:?set HKV_INCLUDE to the include folder of a HierarchicalKV checkout}"
  nvcc -std=c++17 -O3 -arch=sm_${SOK_CUDA_ARCHS:-90} --expt-relaxed-constexpr -I. -I"$HKV_INCLUDE" \
    benchmarks/gpu/t6_hkv_hybrid.cu -o "$HKV_BINARY" > "$OUT/t6_hkv_build.log" 2>&1 \
    || { tail -20 "$OUT/t6_hkv_build.log"; exit 1; }
fi
[ -n "${BUILD_ONLY:-}" ] && exit 0
python3 benchmarks/gpu/tf_tiered.py --variants "$VARIANTS" --rounds "$ROUNDS" \
  --keys-dir "$KEYS_DIR" ${TIERED_ARGS:-} 2>&1 | grep -v "$NOISE" | tee "$OUT/tf_tiered_bench.log"
for name in ${VARIANTS//,/ }; do
  read -r keys batch budget optimizer < <(python3 -c "import sys
sys.path.insert(0, 'benchmarks/gpu')
import tf_tiered as t; k, g, b, o = t.VARIANTS['$name']; print(k, b, int(g * t.GIB), o)" 2>/dev/null)
  timeout ${HKV_TIMEOUT:-300} "$HKV_BINARY" "$KEYS_DIR/${name}_keys.bin" "$keys" "$batch" "$budget" \
    "$ROUNDS" "$optimizer" \
    | tee "$KEYS_DIR/${name}_hkv.json" | tee -a "$OUT/tf_tiered_bench.log"
done
python3 benchmarks/gpu/tf_tiered.py --merge-hkv "$KEYS_DIR" 2>&1 | grep -v "$NOISE" \
  | tee -a "$OUT/tf_tiered_bench.log"
