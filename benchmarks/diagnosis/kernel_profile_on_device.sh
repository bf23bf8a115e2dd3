#!/usr/bin/env bash
# Diagnosis: wall time and Nsight Compute's kernel list of each named workload's train step
# (tf_gpu_kernel_profile.py), after the plugin's CUDA build (benchmarks/gpu/tf_on_device.sh).
# Needs what tf_on_device.sh needs, and ncu. Usage: bash kernel_profile_on_device.sh t1 g1b ...
# Summaries in $OUT (default benchmarks/out).
set -uo pipefail
cd "$(dirname "$0")/../.."
export PYTHONPATH=$PWD:$PYTHONPATH OUT=${OUT:-benchmarks/out}
mkdir -p "$OUT"
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu /usr/local/cuda/bin/ncu 2>/dev/null | head -1)
SCRIPT=benchmarks/diagnosis/tf_gpu_kernel_profile.py
for name in "$@"; do
  wall=$(python3 $SCRIPT "$name" 2>&1 | grep "^# " | tail -1)
  echo "$wall"
  loop=$(echo "$wall" | sed -n 's/.*loop \([0-9.]*\) ms.*/\1/p')
  timeout 300 "$NCU" --profile-from-start off --clock-control none --metrics gpu__time_duration.sum \
    --csv python3 $SCRIPT "$name" > "$OUT/ncu_$name.csv" 2> "$OUT/ncu_$name.err"
  python3 $SCRIPT summarize "$OUT/ncu_$name.csv" "$loop" | tee "$OUT/kernels_$name.txt"
done
