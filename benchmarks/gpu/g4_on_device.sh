#!/usr/bin/env bash
# G4: this package's GPU hash table against HierarchicalKV in one CUDA program, same GPU, same
# keys (benchmarks/gpu/g4_vs_hkv.cu). Builds it, runs it, and writes g4_vs_hkv.json (ratios and
# provenance added by g4_result.py).
# Needs: nvcc >= 12 and python3 on PATH; HKV_INCLUDE, the include folder of a HierarchicalKV
# checkout (github.com/NVIDIA-Merlin/HierarchicalKV); SOK_CUDA_ARCHS (default 90), one
# compute capability. Results land in $OUT (default benchmarks/out).
set -euo pipefail
cd "$(dirname "$0")/../.."
export OUT=${OUT:-benchmarks/out}
mkdir -p "$OUT"
: "${HKV_INCLUDE:?set HKV_INCLUDE to the include folder of a HierarchicalKV checkout}"
nvcc -std=c++17 -O3 -arch=sm_${SOK_CUDA_ARCHS:-90} --expt-relaxed-constexpr -I. -I"$HKV_INCLUDE" \
  benchmarks/gpu/g4_vs_hkv.cu kit_src/core/hash_table/gpu_hash_table.cu \
  kit_src/core/hash_table/gpu_table_lookup.cu kit_src/core/hash_table/gpu_table_write.cu \
  kit_src/core/hash_table/gpu_table_apply.cu kit_src/core/hash_table/gpu_table_evict.cu \
  kit_src/core/optimizers/sparse_apply.cu kit_src/core/embedding/lookup_gpu.cu \
  kit_src/core/optimizers/rule_by_name.cc -o "$OUT/g4_vs_hkv"
"$OUT/g4_vs_hkv" > "$OUT/g4_vs_hkv_raw.json"
NVCC_VERSION=$(nvcc --version | sed -n 's/.*release \([0-9.]*\).*/\1/p') \
  python3 benchmarks/gpu/g4_result.py "$OUT/g4_vs_hkv_raw.json" "$OUT/g4_vs_hkv.json"
python3 benchmarks/run.py --results "$OUT"
