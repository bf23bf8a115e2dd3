#!/usr/bin/env bash
# The README's main job: generate a Criteo-format dataset with a planted signal (once), split
# it, and train DLRM with sok tables on 2 Horovod (Gloo) workers on this machine's CPUs.
# Usage: run_cpu_demo.sh [extra main.py flags]
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=.venv/bin/python
DATA=${DLRM_DATA:-data/dlrm}
TRAIN_SAMPLES=${DLRM_TRAIN_SAMPLES:-1000000}
TEST_SAMPLES=${DLRM_TEST_SAMPLES:-100000}
HERE=tutorials/DLRM_Benchmark
SLOTS=$($PY -c "import sys; sys.path.insert(0, '$HERE'); from criteo_format import VOCABULARIES; print(VOCABULARIES['notebook'])")

stamp="$DATA/.ready-$TRAIN_SAMPLES-$TEST_SAMPLES"
if [ ! -f "$stamp" ]; then
  rm -rf "$DATA" && mkdir -p "$DATA"
  $PY $HERE/gen_data.py "$DATA/raw" --train_samples "$TRAIN_SAMPLES" --test_samples "$TEST_SAMPLES" \
    | tee "$DATA/ceiling.txt"
  for split in train test; do
    $PY $HERE/split_bin.py "$DATA/raw/$split.bin" "$DATA/$split" --slot_size_array="$SLOTS" \
      --dense_type int32 --label_type int32 --category_type int32 --dense_log True
  done
  rm -rf "$DATA/raw"
  touch "$stamp"
fi
grep "ceiling" "$DATA/ceiling.txt" || true
PYTHONPATH=. TF_CPP_MIN_LOG_LEVEL=2 .venv/bin/horovodrun -np 2 -H localhost:2 --gloo \
  $PY $HERE/main.py --data_dir "$DATA" --global_batch_size 4096 --optimizer adam --lr 0.002 \
  --warmup_steps 20 --embedding_dim 128 --custom_interact --epochs 1 --log_interval 25 "$@"
