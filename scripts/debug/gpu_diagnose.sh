#!/usr/bin/env bash
# One diagnosis round on the GPU machine (after device_setup.sh): build, native backtrace of
# the out-of-range crash, the single-process suite's failures, the one-id step's parts.
set -uo pipefail
cd "$(dirname "$0")/../.."
source .ferry/bin/env.sh
export PYTHONPATH=$PWD:$PYTHONPATH PYTHONUNBUFFERED=1
SOK_BUILD_CUDA=1 SOK_CUDA_ARCHS=90 python3 scripts/build_plugin.py > $OUT/build.log 2>&1 || { tail -30 $OUT/build.log; exit 1; }
gcc -shared -fPIC -o /tmp/segv.so scripts/debug/segv_backtrace.c
F="Unable to register\|C-API\|importlib\|DeprecationWarning\|_pytest\|pluggy\|Extension modules"
LD_PRELOAD=/tmp/segv.so timeout 200 python3 -m pytest -q -x -p no:faulthandler -p no:cacheprovider \
  "tests/test_devices.py::test_out_of_range_id" 2>&1 | grep -v "$F" | tail -40
timeout 300 python3 -m pytest -q -rf --tb=short -p no:cacheprovider tests/test_api.py 2>&1 | grep -v "$F" | tail -40
timeout 120 python3 scripts/debug/gpu_parts.py 2>&1 | grep -v "$F" | tail -10
