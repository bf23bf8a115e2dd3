#!/usr/bin/env bash
# Creates .venv with pinned TensorFlow, Horovod (Gloo) and the plugin. Idempotent: each step
# is skipped when what it produces is already there, so a second run takes seconds.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3.11}
VENV=.venv

if [ ! -x "$VENV/bin/python" ]; then
  echo "[setup] creating $VENV"
  "$PYTHON" -m venv "$VENV"
fi
PY="$VENV/bin/python"

stamp_deps="$VENV/.deps-v1"
if [ ! -f "$stamp_deps" ]; then
  echo "[setup] installing pinned Python dependencies"
  "$PY" -m pip install -q --upgrade pip
  "$PY" -m pip install -q -r requirements.txt
  touch "$stamp_deps"
fi

if ! "$PY" -c "import horovod.tensorflow" 2>/dev/null; then
  echo "[setup] building Horovod 0.28.1 with Gloo (about 3-5 minutes on 2 cores)"
  HOROVOD_WITH_TENSORFLOW=1 HOROVOD_WITH_GLOO=1 HOROVOD_WITHOUT_MPI=1 \
  HOROVOD_WITHOUT_PYTORCH=1 HOROVOD_WITHOUT_MXNET=1 HOROVOD_CPU_OPERATIONS=GLOO \
  MAKEFLAGS="-j$(nproc)" \
    "$PY" -m pip install -q --no-build-isolation --no-cache-dir horovod==0.28.1
fi

# The plugin: rebuilt by CMake incrementally; the editable install points the package at it.
echo "[setup] building the plugin"
"$PY" scripts/build_plugin.py
stamp_pkg="$VENV/.editable-v1"
if [ ! -f "$stamp_pkg" ]; then
  "$PY" -m pip install -q --no-deps --no-build-isolation -e .
  touch "$stamp_pkg"
fi
