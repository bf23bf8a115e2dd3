"""The TF GPU OpKernels compile against TensorFlow's headers with nvcc (no GPU needed).

They cannot run here (tensorflow-cpu) nor on the GPU machine (no TensorFlow); their CUDA core
is tested on the GPU through the C ABI (tests/gpu). Skipped where nvcc is missing."""
import os
import shutil
import subprocess

import pytest
import tensorflow as tf

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GPU_KERNELS = ["kit_src/tf/kernels/interaction_kernels_gpu.cu.cc"]
NVCC = shutil.which("nvcc")


def cuda_include():
    for candidate in [os.path.join(os.path.dirname(os.path.dirname(os.path.realpath(NVCC))),
                                   "include"), "/usr/local/cuda/include"]:
        if os.path.exists(os.path.join(candidate, "cuda_runtime.h")):
            return candidate
    pytest.skip("no CUDA include directory next to nvcc")


@pytest.mark.skipif(NVCC is None, reason="nvcc is not installed")
@pytest.mark.parametrize("source", GPU_KERNELS)
def test_gpu_opkernel_compiles_with_nvcc(source, tmp_path):
    # TensorFlow's headers include "third_party/gpus/cuda/include/...": point that at CUDA.
    link = tmp_path / "third_party" / "gpus" / "cuda"
    link.mkdir(parents=True)
    os.symlink(cuda_include(), link / "include")
    flags = [f for f in tf.sysconfig.get_compile_flags() if not f.startswith("--std")]
    result = subprocess.run(
        [NVCC, "-std=c++17", "-c", "-x", "cu", os.path.join(ROOT, source), "-o",
         str(tmp_path / "kernel.o"), f"-I{ROOT}", f"-I{tmp_path}", "-DGOOGLE_CUDA=1",
         "--expt-relaxed-constexpr", "-arch=sm_80", "-Xcompiler", "-fPIC", *flags],
        capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-4000:]
    symbols = subprocess.run(["nm", "-C", str(tmp_path / "kernel.o")], capture_output=True,
                             text=True).stdout
    assert "GpuOp" in symbols  # the OpKernel classes were compiled, not preprocessed away
