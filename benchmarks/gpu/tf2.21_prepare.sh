#!/usr/bin/env bash
# Usage (on a machine with PyPI, in the repository root): tf2.21_prepare.sh DEST
# Downloads TensorFlow 2.21.0's GPU wheel (the CUDA 12 build for Python 3.12, the GPU
# machine's Python), Keras 3.15.1, tf_keras 2.21.0, the two CUDA 12 wheels of
# tensorflow[and-cuda] that a CUDA 13 image has no counterpart for (the CUDA runtime, and the
# compiler whose ptxas XLA runs), the small dependencies such an image lacks and Horovod's
# source, and splits them into DEST/part0 .. DEST/part9, each under 64 MB. The image's CUDA 13
# cuBLAS, cuDNN 9, cuFFT, cuSOLVER and cuSPARSE serve under their CUDA 12 names
# (tf2.21_device_setup.sh links them), so those wheels do not travel. On the GPU machine: copy
# every part's files into one folder, then run tf2.21_device_setup.sh with that folder.
set -euo pipefail
DEST=${1:?usage: tf2.21_prepare.sh DEST}
CACHE=${WHEEL_CACHE:-/tmp/tf2.21_wheels}
TFW=tensorflow-2.21.0-cp312-cp312-manylinux_2_27_x86_64.whl
mkdir -p "$CACHE"
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux_2_27_x86_64 \
  --platform manylinux_2_28_x86_64 --platform manylinux2010_x86_64 --platform manylinux_2_12_x86_64 \
  -d "$CACHE" tensorflow==2.21.0 keras==3.15.1 tf_keras==2.21.0 namex==0.1.0 optree==0.20.0 \
  h5py==3.14.0 ml_dtypes==0.6.0 protobuf==7.36.2 flatbuffers==25.12.19 gast==0.7.0 \
  astunparse==1.6.3 google_pasta==0.2.0 termcolor==3.3.0 six==1.17.0 \
  nvidia-cuda-runtime-cu12==12.9.79 nvidia-cuda-nvcc-cu12==12.9.86
python3 -m pip download -q --no-deps --no-binary=:all: -d "$CACHE" horovod==0.28.1
rm -rf "$DEST"/part? && mkdir -p "$DEST"
split -b 63000000 -d -a 1 "$CACHE/$TFW" "$DEST/tfw."
for chunk in "$DEST"/tfw.?; do i=${chunk##*.}; mkdir -p "$DEST/part$i"; mv "$chunk" "$DEST/part$i/"; done
# The small wheels and Horovod's source ride with the last (small) chunk.
cp "$CACHE"/*.whl "$CACHE"/horovod-0.28.1.tar.gz "$DEST/part$i/" && rm -f "$DEST/part$i/$TFW"
(cd "$CACHE" && md5sum "$TFW") > "$DEST/part$i/tf.md5"
du -sb "$DEST"/part? | awk '{ if ($1 >= 64000000) bad = 1; printf "%s %d MB  ", $2, $1 / 1e6 }
  END { print ""; exit bad }' || { echo "a part is over 64 MB" >&2; exit 1; }
