"""`python -m sparse_operation_kit.info`: the build report agrees with the build it describes."""
import json

import pytest
import os
import re
import subprocess
import sys

import tensorflow as tf
from conftest import ROOT, subprocess_env



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


@pytest.mark.parametrize("tensorflow_version,keras_version,reason", [
    ("2.15.1", "2.15.0", None),
    ("2.16.2", "2.16.0", None),
    ("2.16.2", "3.3.3", None),
    ("2.21.0", "2.21.0", None),
    ("2.21.0", "3.15.1", None),
    ("2.15.1", "3.0.0", "Keras 3.0.0 under TensorFlow 2.15 is not supported"),
    ("2.21.0", "4.0.0", "tf.keras is Keras 4.0.0 under TensorFlow 2.21.0"),
    ("2.22.0", "2.22.0", "TensorFlow 2.22.0 is not supported"),
    ("2.14.1", "2.14.0", "TensorFlow 2.14.1 is not supported"),
])
def test_supported_lines(tensorflow_version, keras_version, reason):
    from sparse_operation_kit import _versions
    found = _versions.unsupported(tensorflow_version, keras_version)
    assert found == reason if reason is None else found.startswith(reason)


@pytest.mark.parametrize("allow", [False, True])
def test_an_unsupported_tensorflow_is_refused_at_import(allow):
    """Importing under another TensorFlow line names the supported ones; the override warns."""
    script = ("import warnings, tensorflow as tf\n"
              "tf.__version__ = '2.22.0'\n"
              "with warnings.catch_warnings(record=True) as caught:\n"
              "    warnings.simplefilter('always')\n"
              "    import sparse_operation_kit\n"
              "print('imported', any('not supported' in str(w.message) for w in caught))\n")
    env = subprocess_env()
    env.pop("SOK_ALLOW_UNSUPPORTED_VERSIONS", None)
    if allow:
        env["SOK_ALLOW_UNSUPPORTED_VERSIONS"] = "1"
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                            env=env, timeout=300)
    if allow:
        assert result.returncode == 0 and "imported True" in result.stdout, result.stderr[-2000:]
    else:
        assert result.returncode != 0
        assert "TensorFlow 2.22.0 is not supported. Supported: TensorFlow 2.15" in result.stderr
