"""`python -m sparse_operation_kit.info`: the build report agrees with the build it describes."""
import json
import os
import re
import subprocess
import sys

import tensorflow as tf
from conftest import subprocess_env

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def report(*args, env=None):
    result = subprocess.run([sys.executable, "-m", "sparse_operation_kit.info", *args],
                            env=env or subprocess_env(), capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout


def test_report_names_versions_library_and_build():
    facts = json.loads(report("--json"))
    with open(os.path.join(ROOT, "sparse_operation_kit", "version.py")) as handle:
        version = re.search(r'__version__ = "(.+)"', handle.read()).group(1)
    assert facts["sparse_operation_kit"] == version
    assert facts["tensorflow"] == tf.__version__
    assert re.match(r"\d+\.\d+", facts["keras"]), facts["keras"]
    assert os.path.exists(facts["library"]), facts["library"]
    with open(os.path.join(os.path.dirname(facts["library"]), "build_info.json")) as handle:
        built = json.load(handle)
    assert built["tensorflow"] == tf.__version__
    if built["cuda"]:
        assert facts["gpu_kernels"].startswith("yes"), facts
        assert built["cuda_archs"] in facts["gpu_kernels"]
    else:
        assert facts["gpu_kernels"].startswith("no"), facts
        assert facts["nccl"].startswith("not used"), facts


def test_report_horovod_status():
    facts = json.loads(report("--json"))
    try:
        import horovod
    except ImportError:
        assert facts["horovod"].startswith("not available"), facts
        return
    assert facts["horovod"].startswith(horovod.__version__), facts
    assert "Gloo" in facts["horovod"] or "NCCL" in facts["horovod"] or "MPI" in facts["horovod"]


def test_plain_report_is_one_fact_a_line():
    lines = report().strip().splitlines()
    names = [line.split(":", 1)[0] for line in lines]
    assert names[:5] == ["sparse_operation_kit", "python", "tensorflow", "keras", "library"]
    assert {"gpu_kernels", "nccl", "horovod"} <= set(names)


def test_missing_library_is_reported_not_raised(tmp_path):
    env = dict(subprocess_env(), SOK_OPS_LIBRARY=str(tmp_path / "absent" / "libsok_ops.so"))
    facts = json.loads(report("--json", env=env))
    assert "not loadable" in facts["library"] and "missing" in facts["library"]
    assert facts["gpu_kernels"].startswith("unknown")
