# Sourced by tf_on_device.sh and multi_gpu_on_device.sh: works from the repository root, with
# $OUT (default benchmarks/out) made and the checkout first on PYTHONPATH.
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
export OUT=${OUT:-benchmarks/out} PYTHONUNBUFFERED=1
mkdir -p "$OUT"
export PYTHONPATH=$PWD:$PYTHONPATH

# build_plugin LOG: the op library with its GPU kernels (SOK_CUDA_ARCHS, default 90); on a
# failed build, the log's tail and exit.
build_plugin() {
  SOK_BUILD_CUDA=1 SOK_CUDA_ARCHS=${SOK_CUDA_ARCHS:-90} python3 scripts/build_plugin.py > "$1" 2>&1 \
    || { tail -40 "$1"; exit 1; }
}
