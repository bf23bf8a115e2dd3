#!/usr/bin/env bash
# Creates a venv with pinned TensorFlow, Horovod (Gloo) and the plugin. Idempotent: each step
# is skipped when what it produces is already there, so a second run takes seconds.
#   SOK_TF=2.15 (default): .venv, tensorflow-cpu 2.15.1
#   SOK_TF=2.16:           .venv-tf2.16, tensorflow-cpu 2.16.2 + tf_keras (Keras 2)
#   SOK_TF=2.21:           .venv-tf2.21, tensorflow-cpu 2.21.0 with Keras 3, and tf_keras (Keras 2)
#   SOK_TF=2.17 .. 2.20:   .venv-tf2.17 .. .venv-tf2.20, that line's last tensorflow-cpu and
#                          tf_keras (the lines CI builds and smoke-tests)
#   SKIP_HOROVOD=1:        any line without Horovod (single-worker tests only)
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3.11}
SOK_TF=${SOK_TF:-2.15}
case "$SOK_TF" in
  2.15) VENV=.venv; REQUIREMENTS=requirements.txt; HVD_CXXFLAGS="" ;;
  # Horovod 0.28.1 misses standard includes that TF 2.16's headers no longer bring in.
  2.16) VENV=.venv-tf2.16; REQUIREMENTS=requirements-tf2.16.txt
        HVD_CXXFLAGS="-include string -include cstdint -include stdexcept" ;;
  2.21) VENV=.venv-tf2.21; REQUIREMENTS=requirements-tf2.21.txt
        HVD_CXXFLAGS="-include string -include cstdint -include stdexcept" ;;
  2.17|2.18|2.19|2.20)
        VENV=.venv-tf$SOK_TF; REQUIREMENTS=requirements-tf-smoke.txt
        HVD_CXXFLAGS="-include string -include cstdint -include stdexcept"
        case "$SOK_TF" in
          2.17) SOK_TF_VERSION=2.17.1; SOK_TF_KERAS_VERSION=2.17.0 ;;
          2.18) SOK_TF_VERSION=2.18.1; SOK_TF_KERAS_VERSION=2.18.0 ;;
          2.19) SOK_TF_VERSION=2.19.1; SOK_TF_KERAS_VERSION=2.19.0 ;;
          2.20) SOK_TF_VERSION=2.20.0; SOK_TF_KERAS_VERSION=2.20.1 ;;
        esac
        export SOK_TF_VERSION SOK_TF_KERAS_VERSION ;;
  *) echo "SOK_TF must be one of 2.15 to 2.21, got '$SOK_TF'" >&2; exit 2 ;;
esac
export TF_USE_LEGACY_KERAS=1  # TF 2.16: tf.keras is Keras 2 (tf_keras); ignored by 2.15

if [ ! -x "$VENV/bin/python" ]; then
  echo "[setup] creating $VENV"
  "$PYTHON" -m venv "$VENV"
fi
PY="$VENV/bin/python"

stamp_deps="$VENV/.deps-v2"
if [ ! -f "$stamp_deps" ]; then
  echo "[setup] installing pinned Python dependencies ($REQUIREMENTS)"
  "$PY" -m pip install -q --upgrade pip
  "$PY" -m pip install -q -r "$REQUIREMENTS"
  touch "$stamp_deps"
fi

if [ -z "${SKIP_HOROVOD:-}" ] && ! "$PY" -c "import horovod.tensorflow" 2>/dev/null; then
  echo "[setup] building Horovod 0.28.1 with Gloo against TF $SOK_TF (about 3-5 minutes on 2 cores)"
  HVD_SOURCE=horovod==0.28.1
  if [ "$SOK_TF" != 2.15 ] && [ "$SOK_TF" != 2.16 ]; then
    # Horovod's XLA ops (a GPU feature, HOROVOD_ENABLE_XLA_OPS) include XLA headers that moved
    # or that newer TensorFlow wheels lack: its release is built without them, from its
    # source on PyPI.
    HVD_DIR=$(mktemp -d)
    "$PY" -m pip download -q --no-deps --no-binary :all: -d "$HVD_DIR" horovod==0.28.1
    tar -xzf "$HVD_DIR/horovod-0.28.1.tar.gz" -C "$HVD_DIR"
    sed -i '/xla_mpi_ops.cc/d' "$HVD_DIR/horovod-0.28.1/horovod/tensorflow/CMakeLists.txt"
    HVD_SOURCE="$HVD_DIR/horovod-0.28.1"
  fi
  CXXFLAGS="$HVD_CXXFLAGS" CMAKE_POLICY_VERSION_MINIMUM=3.5 \
  HOROVOD_WITH_TENSORFLOW=1 HOROVOD_WITH_GLOO=1 HOROVOD_WITHOUT_MPI=1 \
  HOROVOD_WITHOUT_PYTORCH=1 HOROVOD_WITHOUT_MXNET=1 HOROVOD_CPU_OPERATIONS=GLOO \
  MAKEFLAGS="-j$(nproc)" \
    "$PY" -m pip install -q --no-build-isolation --no-cache-dir "$HVD_SOURCE"
  if [ -n "${HVD_DIR:-}" ]; then rm -rf "$HVD_DIR"; fi
fi

# The plugin: rebuilt by CMake incrementally (one build folder per TensorFlow version); the
# editable install points the package at the source tree, which holds a library per version.
echo "[setup] building the plugin"
"$PY" scripts/build_plugin.py
stamp_pkg="$VENV/.editable-v1"
if [ ! -f "$stamp_pkg" ]; then
  "$PY" -m pip install -q --no-deps --no-build-isolation -e .
  touch "$stamp_pkg"
fi
