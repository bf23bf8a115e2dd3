#!/usr/bin/env bash
# Run on the CPU machine, in the repository root, after ../shared/gpu_tf/prepare.sh (whose
# .ferry/c9 holds Horovod's source). Downloads TensorFlow 2.21.0's GPU wheel (the CUDA 12 build
# for Python 3.12, the GPU machine's Python), Keras 3.15.1, tf_keras 2.21.0, the two CUDA 12
# wheels of tensorflow[and-cuda] that the GPU machine's CUDA 13 image has no counterpart for
# (the CUDA runtime, and the compiler whose ptxas XLA runs), and the small dependencies the
# image lacks; splits them into .ferry/t0 .. .ferry/t9, each under one transfer's 64 MiB.
# The image's CUDA 13 cuBLAS, cuDNN 9, cuFFT, cuSOLVER and cuSPARSE serve under their CUDA 12
# names (tf2.21_device_setup.sh links them), so those wheels do not travel.
# On the GPU machine: for K in 0..8 one transfer carrying .ferry/tK with the command
#   mkdir -p /tmp/ferry2.21 && cp .ferry/tK/* /tmp/ferry2.21/
# then, carrying .ferry/t9: bash benchmarks/gpu/tf2.21_device_setup.sh [--horovod].
set -euo pipefail
ROOT=$(git rev-parse --show-toplevel)
CACHE=${FERRY_CACHE:-/tmp/tf2.21_wheels}
TFW=tensorflow-2.21.0-cp312-cp312-manylinux_2_27_x86_64.whl
cd "$ROOT"
grep -qx '/.ferry/' .git/info/exclude 2>/dev/null || echo '/.ferry/' >> .git/info/exclude
mkdir -p "$CACHE"
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux_2_27_x86_64 \
  --platform manylinux_2_28_x86_64 --platform manylinux2010_x86_64 --platform manylinux_2_12_x86_64 \
  -d "$CACHE" tensorflow==2.21.0 keras==3.15.1 tf_keras==2.21.0 namex==0.1.0 optree==0.20.0 \
  h5py==3.14.0 ml_dtypes==0.6.0 protobuf==7.36.2 flatbuffers==25.12.19 gast==0.7.0 \
  astunparse==1.6.3 google_pasta==0.2.0 termcolor==3.3.0 six==1.17.0 \
  nvidia-cuda-runtime-cu12==12.9.79 nvidia-cuda-nvcc-cu12==12.9.86
[ -f .ferry/c9/horovod-0.28.1.tar.gz ] || { echo "run ../shared/gpu_tf/prepare.sh first" >&2; exit 1; }
rm -rf .ferry/t? && mkdir -p .ferry/t9
split -b 63000000 -d -a 1 "$CACHE/$TFW" .ferry/tfw.
for i in 0 1 2 3 4 5 6 7 8 9; do mkdir -p .ferry/t$i; mv .ferry/tfw.$i .ferry/t$i/; done
# The small wheels and Horovod's source ride with the last (small) chunk.
cp "$CACHE"/*.whl .ferry/t9/ && rm -f .ferry/t9/$TFW && cp .ferry/c9/horovod-0.28.1.tar.gz .ferry/t9/
(cd "$CACHE" && md5sum "$TFW") > .ferry/t9/tf.md5
du -sb .ferry/t? | awk '{ if ($1 >= 64000000) bad = 1; printf "%s %d MB  ", $2, $1 / 1e6 }
  END { print ""; exit bad }' || { echo "a chunk is over 64 MB" >&2; exit 1; }
