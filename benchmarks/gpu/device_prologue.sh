# Sourced by tf_on_device.sh and multi_gpu_on_device.sh: works from the repository root, with
# $OUT (default benchmarks/out) made and the checkout first on PYTHONPATH.
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
export OUT=${OUT:-benchmarks/out} PYTHONUNBUFFERED=1
mkdir -p "$OUT"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}

# KERAS3_WHEELS, a folder of Keras 3's wheels and its dependencies' for the machine's Python
# (pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp
# --platform manylinux_2_17_x86_64 keras==3.15.1 namex optree rich markdown-it-py mdurl
# pygments h5py): they are installed under /tmp/keras3, tf.keras is Keras 3 (no
# TF_USE_LEGACY_KERAS), and the logs' names end in _keras3.
KERAS_TAG=""
if [ -n "${KERAS3_WHEELS:-}" ]; then
  python3 -m pip install -q --no-deps --target /tmp/keras3 "$KERAS3_WHEELS"/*.whl || exit 1
  # Keras 3 imports PyTorch and JAX where installed; the machine's are built for NumPy 2 and
  # fail beside this TensorFlow's NumPy 1, so they are hidden from it.
  for hidden in torch jax jaxlib; do
    mkdir -p /tmp/keras3_hidden/$hidden
    echo "raise ImportError('$hidden is hidden from Keras 3 here')" > /tmp/keras3_hidden/$hidden/__init__.py
  done
  export PYTHONPATH=/tmp/keras3:/tmp/keras3_hidden:$PYTHONPATH
  unset TF_USE_LEGACY_KERAS
  KERAS_TAG=_keras3
fi

# build_plugin LOG: the op library with its GPU kernels (SOK_CUDA_ARCHS, default 90); on a
# failed build, the log's tail and exit.
build_plugin() {
  SOK_BUILD_CUDA=1 SOK_CUDA_ARCHS=${SOK_CUDA_ARCHS:-90} python3 scripts/build_plugin.py > "$1" 2>&1 \
    || { tail -40 "$1"; exit 1; }
}

# DLRM on generated Criteo-format data (tutorials/DLRM_Benchmark): dlrm_data DIR writes 1M
# training and 100k test records with the notebook's vocabularies once, split as main.py reads
# them, and the generating model's AUC (the ceiling) to DIR.ceiling.
dlrm_data() {
  local data=$1 tutorial=tutorials/DLRM_Benchmark slots
  slots=$(python3 -c "import sys; sys.path.insert(0, '$tutorial'); from criteo_format import VOCABULARIES; print(VOCABULARIES['notebook'])")
  if [ ! -d "$data/train" ]; then
    python3 $tutorial/gen_data.py "$data/raw" --train_samples 1000000 --test_samples 100000 > "$data.ceiling" 2>&1
    for split in train test; do
      python3 $tutorial/split_bin.py "$data/raw/$split.bin" "$data/$split" --slot_size_array="$slots" \
        --dense_type int32 --label_type int32 --category_type int32 --dense_log True > /dev/null
    done
  fi
}
# dlrm_begin LOG: the data in /tmp/dlrm_data, its ceiling as LOG's first line, AUC_FLAGS (the
# README's CPU demo: batch 4,096, Adam 0.002, one epoch, on that data), and `dlrm LABEL ...`,
# dlrm_job into LOG.
dlrm_begin() {
  DLRM_LOG=$1
  dlrm_data /tmp/dlrm_data
  grep ceiling /tmp/dlrm_data.ceiling | tee "$DLRM_LOG"
  AUC_FLAGS="--data_dir /tmp/dlrm_data --global_batch_size 4096 --optimizer adam --lr 0.002 --warmup_steps 20 --custom_interact --epochs 1 --log_interval 100"
}
dlrm() { dlrm_job "$DLRM_LOG" "$@"; }
# dlrm_job LOG LABEL [VAR=value...] COMMAND...: the job's FINAL line (or its errors) under LABEL.
# run_h N FLAGS...: main.py on N Horovod workers (Gloo for the launcher; tables on the GPUs).
dlrm_job() {
  local log=$1 label=$2; shift 2
  echo "== $label" >> "$log"
  timeout 240 env "$@" 2>&1 | grep -v "Unable to register\|C-API\|cpu_feature_guard\|rebuild TensorFlow\|oneDNN custom\|call to cuInit" \
    | grep "FINAL\|Error\|error" | tail -3 | tee -a "$log"
}
if ! type horovodrun > /dev/null 2>&1; then  # Horovod installed with pip --target: no script
  horovodrun() { python3 -c 'import sys; from horovod.runner.launch import run_commandline; sys.exit(run_commandline())' "$@"; }
fi
run_h() { local np=$1; shift; horovodrun -np $np -H localhost:$np --gloo python3 tutorials/DLRM_Benchmark/main.py "$@"; }
export -f run_h
! declare -F horovodrun > /dev/null || export -f horovodrun
