#!/usr/bin/env bash
# Same-machine A/B of the CPU benchmarks against a baseline build of the library: BASE is a
# tree of the baseline (e.g. `git archive <commit>` extracted) whose op library is built for
# the same TensorFlow (`python scripts/build_plugin.py` there). Each of BENCHES (scripts in
# benchmarks/cpu/ of this tree) runs ROUNDS times with each library, the order of the two
# alternating round by round; each run's JSON lands in $OUT/ab/base_<round>/ and
# $OUT/ab/new_<round>/, and benchmarks/ab_compare.py compares them ($OUT/ab_compare.log).
#
#   BASE=/tmp/ab_base BENCHES="c2_c3_hash_table.py c4_dynamic_training.py" ROUNDS=2 \
#     bash benchmarks/cpu/ab_on_cpu.sh
set -uo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD
PY=${PY:-$ROOT/.venv/bin/python}
OUT=${OUT:-benchmarks/out}
mkdir -p "$OUT/ab"
OUT=$(cd "$OUT" && pwd)
ROUNDS=${ROUNDS:-2}
for round in $(seq 1 "$ROUNDS"); do
  sides="base new"
  [ $((round % 2)) -eq 0 ] && sides="new base"
  for bench in $BENCHES; do
    for side in $sides; do
      tree=$ROOT
      [ "$side" = base ] && tree=$BASE
      echo "== round $round: $bench, $side library"
      # This tree's benchmark script with either tree's package and library.
      (cd "$tree" && export OUT="$OUT/ab/${side}_$round" PYTHONPATH="$tree" \
        && "$PY" -c "import sparse_operation_kit as s; print('package', s.__file__)" \
        && "$PY" "$ROOT/benchmarks/cpu/$bench") > "$OUT/ab/${side}_${round}_${bench%.py}.log" 2>&1 \
        || tail -5 "$OUT/ab/${side}_${round}_${bench%.py}.log"
    done
  done
done
"$PY" benchmarks/ab_compare.py "$OUT/ab" | tee "$OUT/ab_compare.log"
