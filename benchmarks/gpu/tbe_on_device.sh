#!/usr/bin/env bash
# FBGEMM TBE against this project's TensorFlow path on one GPU (docs/benchmarks.md, "Against
# FBGEMM TBE"). By STAGES (default "install ids tbe tf"):
#   install  fbgemm-gpu 1.6.0 into $FBGEMM_SITE (default /tmp/fbgsite) from its wheel, given
#            whole as $FBGEMM_WHEEL or in parts $FBGEMM_PARTS/part.* (md5 checked)
#   ids      the ids of every workload, written once to $IDS_DIR (default /tmp/tbe_ids)
#   tbe      tbe_torch.py in its own process (the machine's PyTorch, no TensorFlow on the path)
#   tf       builds the op library, then tf_vs_tbe.py (TensorFlow with the plugin), which adds
#            its workloads to $IDS_DIR/tf_vs_tbe.json (kept across calls) and copies it to $OUT
# WORKLOADS (default all) names a subset, e.g. "T3 G1a". Logs and JSON land in $OUT.
set -uo pipefail
cd "$(dirname "$0")/../.."
export OUT=${OUT:-benchmarks/out} PYTHONUNBUFFERED=1
mkdir -p "$OUT"
STAGES=${STAGES:-install ids tbe tf}
IDS_DIR=${IDS_DIR:-/tmp/tbe_ids}
FBGEMM_SITE=${FBGEMM_SITE:-/tmp/fbgsite}
FBGEMM_MD5=${FBGEMM_MD5:-f514e36c824b696aa4feb45e2b12562a}
WHEEL_NAME=fbgemm_gpu-1.6.0-cp312-cp312-manylinux_2_28_x86_64.whl
NOISE="Unable to register\|C-API\|importlib\|DeprecationWarning\|Extension modules"
# PyTorch's Python, without the TensorFlow site that env.sh puts on the path.
TORCH_PYTHON=(env -u PYTHONPATH -u LD_LIBRARY_PATH PYTHONPATH="$FBGEMM_SITE" python3)

if [[ $STAGES == *install* ]]; then
  wheel=${FBGEMM_WHEEL:-/tmp/$WHEEL_NAME}
  if [ -z "${FBGEMM_WHEEL:-}" ]; then
    cat "${FBGEMM_PARTS:-/tmp/fbg}"/part.* > "$wheel" || exit 1
  fi
  echo "$FBGEMM_MD5  $wheel" | md5sum -c - || exit 1
  python3 -m pip install -q --no-index --no-deps --no-compile --target "$FBGEMM_SITE" "$wheel" \
    || exit 1
fi
if [[ $STAGES == *ids* ]]; then
  python3 benchmarks/gpu/tbe_workloads.py "$IDS_DIR" ${WORKLOADS:-} || exit 1
fi
if [[ $STAGES == *tbe* ]]; then
  timeout 540 "${TORCH_PYTHON[@]}" benchmarks/gpu/tbe_torch.py "$IDS_DIR" ${WORKLOADS:-} 2>&1 \
    | grep -v "$NOISE" > "$OUT/tbe_bench.log"
  grep "^T\|^G\|Error" "$OUT/tbe_bench.log" | cut -c1-400
  cp "$OUT/tbe.json" "$IDS_DIR/tbe.json"  # for later calls' tf stage
fi
if [[ $STAGES == *tf* ]]; then
  export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
  SOK_BUILD_CUDA=1 SOK_CUDA_ARCHS=${SOK_CUDA_ARCHS:-90} python3 scripts/build_plugin.py \
    > "$OUT/tf_gpu_build.log" 2>&1 || { tail -40 "$OUT/tf_gpu_build.log"; exit 1; }
  # Workloads measured by earlier calls stay in $IDS_DIR/tf_vs_tbe.json; the merged file
  # is written to $OUT.
  timeout 540 python3 benchmarks/gpu/tf_vs_tbe.py "$IDS_DIR" "$IDS_DIR/tbe.json" ${WORKLOADS:-} 2>&1 \
    | grep -v "$NOISE" > "$OUT/tf_vs_tbe_bench.log"
  cat "$OUT/tf_vs_tbe_bench.log" >> "$IDS_DIR/tf_vs_tbe_bench.log"
  cp "$IDS_DIR/tf_vs_tbe_bench.log" "$OUT/tf_vs_tbe_bench.log"
  grep "^T\|^G\|Error" "$OUT/tf_vs_tbe_bench.log" | cut -c1-400
fi
exit 0
