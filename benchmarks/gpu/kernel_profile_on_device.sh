#!/usr/bin/env bash
# On the GPU machine after device_setup.sh and the plugin's build: wall time and ncu's kernel
# list of each named workload's train step (tf_gpu_kernel_profile.py), summaries in $OUT.
set -uo pipefail
cd "$(dirname "$0")/../.."
source .ferry/bin/env.sh
export PYTHONPATH=$PWD:$PYTHONPATH
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu /usr/local/cuda/bin/ncu 2>/dev/null | head -1)
SCRIPT=benchmarks/gpu/tf_gpu_kernel_profile.py
for name in "$@"; do
  wall=$(python3 $SCRIPT "$name" 2>&1 | grep "^# " | tail -1)
  echo "$wall"
  loop=$(echo "$wall" | sed -n 's/.*loop \([0-9.]*\) ms.*/\1/p')
  timeout 300 "$NCU" --profile-from-start off --clock-control none --metrics gpu__time_duration.sum \
    --csv python3 $SCRIPT "$name" > "$OUT/ncu_$name.csv" 2> "$OUT/ncu_$name.err"
  python3 $SCRIPT summarize "$OUT/ncu_$name.csv" "$loop" | tee "$OUT/kernels_$name.txt"
done
