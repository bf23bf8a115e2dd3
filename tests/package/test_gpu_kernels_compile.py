"""The CUDA build (SOK_BUILD_CUDA=1): nvcc compiles the GPU OpKernels against TensorFlow's
headers into libsok_ops.so, and that library loads into tensorflow-cpu with a GPU kernel
registered for every op of the static and dynamic paths (they run on the GPU machine: tests/lookup/test_devices.py
and benchmarks/gpu/tf_on_device.sh). Skipped where nvcc is missing; built once per TensorFlow
version in build/tfX.Y-cuda (sm_90 only here, to keep CI quick)."""
import json
import os
import shutil
import subprocess
import sys

import pytest
import tensorflow as tf

from conftest import ROOT

STATIC_PATH_OPS = ["Sok>PartitionKeys", "Sok>GatherShardRows", "Sok>GatherSingleIds",
                   "Sok>SplitGradientByTable", "Sok>CombineForward", "Sok>CombineFromShards",
                   "Sok>CombineBackward", "Sok>StaticApply", "Sok>DotInteraction",
                   "Sok>DotInteractionGrad", "Sok>Unfoldable", "Sok>CheckGatheredIds",
                   "Sok>GuardIds", "Sok>PoolFromTables", "Sok>SpreadPooledGrad",
                   "Sok>PooledGradShares", "Sok>UnpackFeaturesFromHost",
                   "Sok>UnpackStagedFeatures"]
DYNAMIC_PATH_OPS = ["Sok>DynamicTableHandle", "Sok>DynamicTableCreate", "Sok>DynamicTableSize",
                    "Sok>DynamicTableLookup", "Sok>DynamicTableAssign", "Sok>DynamicTableImport",
                    "Sok>DynamicTableErase", "Sok>DynamicTableExport",
                    "Sok>DynamicTableExportWritten", "Sok>DynamicGatherRows",
                    "Sok>SplitDynamicGradient", "Sok>DynamicApply",
                    "Sok>DynamicTableLookupEvict"]
EXCHANGE_OPS = ["Sok>NcclInit", "Sok>AllToAllCounts", "Sok>AllToAll"]  # + NcclUniqueId on CPU

LIST_KERNELS = """
import json, tensorflow as tf
from tensorflow.python.framework import kernels
import sparse_operation_kit as sok
dir(sok.raw_ops)
print(json.dumps(sorted({k.op for k in kernels.get_all_registered_kernels().kernel
                         if k.op.startswith("Sok>") and k.device_type == "GPU"})))
try:  # NCCL loads at run time (Sok>NcclUniqueId, CPU): a missing library is a clear error
    sok.raw_ops.sok_nccl_unique_id()
    print("NCCL loaded")
except tf.errors.OpError as error:
    print("NCCL error:", error.message)
"""


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not installed")
@pytest.mark.skipif(not tf.__version__.startswith("2.15") and not os.environ.get("SOK_CUDA_BUILD_ALL"),
                    reason="built in CI under TF 2.15; the GPU machine builds against 2.16")
@pytest.mark.timeout(1500)
def test_cuda_build_registers_gpu_kernels(tmp_path):
    sys.path.insert(0, os.path.join(ROOT, "scripts"))
    import build_plugin

    env = dict(os.environ, SOK_CUDA_ARCHS=os.environ.get("SOK_CUDA_ARCHS", "90"))
    os.environ.update(env)
    library = build_plugin.build(cuda=True, output_dir=str(tmp_path))
    result = subprocess.run([sys.executable, "-c", LIST_KERNELS], capture_output=True, text=True,
                            env=dict(env, SOK_OPS_LIBRARY=library), timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    lines = result.stdout.strip().splitlines()
    gpu_ops = json.loads(lines[-2])
    missing = [op for op in STATIC_PATH_OPS + DYNAMIC_PATH_OPS + EXCHANGE_OPS if op not in gpu_ops]
    assert not missing, f"no GPU kernel for {missing} (TF {tf.__version__})"
    result = subprocess.run([sys.executable, "-c", LIST_KERNELS], capture_output=True, text=True,
                            env=dict(env, SOK_OPS_LIBRARY=library,
                                     SOK_NCCL_LIBRARY="/nonexistent/libnccl.so.2"), timeout=300)
    assert "cannot load NCCL (/nonexistent/libnccl.so.2)" in result.stdout, (
        result.stdout[-2000:] + result.stderr[-2000:])
    # The build report names the CUDA build: its GPU kernels, their architecture, and NCCL's
    # absence in words.
    result = subprocess.run([sys.executable, "-m", "sparse_operation_kit.info", "--json"],
                            capture_output=True, text=True, timeout=300,
                            env=dict(env, SOK_OPS_LIBRARY=library,
                                     PYTHONPATH=os.pathsep.join([ROOT, env.get("PYTHONPATH", "")]),
                                     SOK_NCCL_LIBRARY="/nonexistent/libnccl.so.2"))
    assert result.returncode == 0, result.stderr[-3000:]
    facts = json.loads(result.stdout)
    assert facts["library"] == library
    assert facts["gpu_kernels"].startswith("yes") and env["SOK_CUDA_ARCHS"] in facts["gpu_kernels"]
    assert facts["nccl"].startswith("not found") and "/nonexistent/libnccl.so.2" in facts["nccl"]
