#!/usr/bin/env bash
# Same-job A/B of the op library against a baseline build on one GPU. Builds this tree and the
# baseline (BASE_TAR: `git archive <commit>` of the baseline, extracted to /tmp/ab_base) with
# their GPU kernels side by side, then runs BENCH (a benchmark script and its arguments,
# relative to this tree, which runs it for both) ROUNDS times with each library in turn, the
# order of the two sides swapped every round (base then new in odd rounds, new then base in
# even ones, so that a drift of the machine within a round favours neither), numbering the
# rounds from FIRST_ROUND (default 1) so that rounds run in separate calls can be compared
# together:
# each run's JSON in $OUT/ab/base_<round>/ and $OUT/ab/new_<round>/, the comparison
# (benchmarks/ab_compare.py) in $OUT/ab_compare.log.
# Needs what tf_on_device.sh needs.
set -uo pipefail
cd "$(dirname "$0")/../.."
export OUT=${OUT:-benchmarks/out} PYTHONUNBUFFERED=1
ROUNDS=${ROUNDS:-2}
FIRST_ROUND=${FIRST_ROUND:-1}
ROOT=$PWD
BASE=/tmp/ab_base
NOISE="Unable to register\|C-API\|importlib\|DeprecationWarning\|retracing"
mkdir -p "$OUT/ab"
OUT=$(cd "$OUT" && pwd)
build() {  # tree, log
  (cd "$1" && SOK_BUILD_CUDA=1 SOK_CUDA_ARCHS=${SOK_CUDA_ARCHS:-90} \
    python3 scripts/build_plugin.py) > "$2" 2>&1 || { tail -30 "$2"; return 1; }
}
if [ ! -f "$BASE/.built" ]; then
  rm -rf "$BASE" && mkdir -p "$BASE" && tar -xf "$BASE_TAR" -C "$BASE"
  (build "$BASE" "$OUT/ab_base_build.log" && touch "$BASE/.built") &
fi
build "$PWD" "$OUT/ab_new_build.log" || exit 1
wait
[ -f "$BASE/.built" ] || exit 1
for round in $(seq "$FIRST_ROUND" $((FIRST_ROUND + ROUNDS - 1))); do
  sides="base new"
  [ $((round % 2)) = 0 ] && sides="new base"
  for side in $sides; do
    tree=$PWD
    [ "$side" = base ] && tree=$BASE
    echo "== round $round: $side library"
    # This tree's benchmark script with either tree's package and library.
    (cd "$tree" && export OUT="$OUT/ab/${side}_$round" PYTHONPATH="$tree:$PYTHONPATH" \
      && python3 -c "import sparse_operation_kit as s; print('package', s.__file__)" \
      && timeout 540 python3 "$ROOT"/$BENCH) 2>&1 | grep -v "$NOISE" > "$OUT/ab/${side}_$round.log"
    tail -2 "$OUT/ab/${side}_$round.log" | cut -c1-200
  done
done
python3 benchmarks/ab_compare.py "$OUT/ab" | tee "$OUT/ab_compare.log"
