import os
import subprocess
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import pytest  # noqa: E402
import tensorflow as tf  # noqa: E402

import sparse_operation_kit as sok  # noqa: E402


ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TESTS = os.path.join(ROOT, "tests")
# The devices a test with a `device` argument runs on: the CPU, and the GPU where there is one.
DEVICES = ["CPU"] + (["GPU"] if tf.config.list_physical_devices("GPU") else [])
# horovodrun, or its module where Horovod was installed with pip --target (the GPU machine).
HOROVODRUN = os.path.join(os.path.dirname(sys.executable), "horovodrun")
LAUNCH = "import sys; from horovod.runner.launch import run_commandline; sys.exit(run_commandline())"
LAUNCHER = [HOROVODRUN] if os.path.exists(HOROVODRUN) else [sys.executable, "-c", LAUNCH]


def horovodrun(script, *args, num_workers=2, timeout=300, expect_success=True, **env_extra):
    """Runs `script` (tests/multiworker) on `num_workers` workers (Gloo launch; on GPUs one
    each, exchanging through NCCL); returns the combined output."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")]),
               TF_CPP_MIN_LOG_LEVEL="2", OMP_NUM_THREADS="1", **env_extra)
    command = LAUNCHER + ["-np", str(num_workers), "-H", f"localhost:{num_workers}", "--gloo",
                          sys.executable, os.path.join(TESTS, "multiworker", script), *args]
    result = subprocess.run(command, env=env, cwd=ROOT, capture_output=True, text=True,
                            timeout=timeout)
    output = result.stdout + result.stderr
    if expect_success:
        assert result.returncode == 0, output[-6000:]
    else:
        assert result.returncode != 0, output[-3000:]
    return output


@pytest.fixture(params=DEVICES)
def device(request):
    """"CPU", then "GPU" where there is one: a test taking it runs once on each."""
    return request.param


def subprocess_env(**extra):
    """The environment of a test's child Python: the repository first on PYTHONPATH, what was
    there kept (on the GPU machines TensorFlow itself comes from PYTHONPATH)."""
    path = os.pathsep.join(p for p in [ROOT, os.environ.get("PYTHONPATH", "")] if p)
    return dict(os.environ, PYTHONPATH=path, TF_CPP_MIN_LOG_LEVEL="2", **extra)


@pytest.fixture(scope="session", autouse=True)
def single_worker():
    """The unit tests run as one worker; multi-worker tests launch their own processes."""
    if not sok.communication.is_initialized():
        # Leaves tf.keras.optimizers alone: the suite tests both optimizer generations.
        sok.init(comm_tool="single", use_legacy_optimizer=False)
    yield


def run_mode(mode, fn):
    """Calls fn eagerly or as a tf.function."""
    return fn() if mode == "eager" else tf.function(fn)()


def assert_lookups_match(outs, ref_outs, grads, ref_grads, grad_atol=1e-5):
    """Each output equals its reference's; each gradient is IndexedSlices (a table's gradient
    stays sparse) and, densified, equals its reference's."""
    for out, ref in zip(outs, ref_outs):
        np.testing.assert_allclose(out.numpy(), ref.numpy(), rtol=1e-5, atol=1e-6)
    for grad, ref_grad in zip(grads, ref_grads):
        assert isinstance(grad, tf.IndexedSlices)
        np.testing.assert_allclose(tf.convert_to_tensor(grad).numpy(),
                                   tf.convert_to_tensor(ref_grad).numpy(), rtol=1e-5,
                                   atol=grad_atol)


def poison(device):
    """Leaves NaN in the memory TensorFlow's allocator hands out next on `device` ("CPU" or
    "GPU"), so an output a kernel fails to write shows."""
    if device == "GPU":
        with tf.device("GPU:0"):
            block = tf.fill([16 << 20], float("nan"))
            block.numpy()
            del block


def on(device, fn, *args):
    """fn(*args) with its ops on `device` ("CPU" or "GPU"), the device's memory poisoned first."""
    poison(device)
    with tf.device(f"{device}:0"):
        return fn(*args)


def graph_nodes(fn, *input_specs):
    """The nodes of fn traced as a tf.function (for input_specs), its library functions'
    included."""
    graph_def = tf.function(fn).get_concrete_function(*input_specs).graph.as_graph_def()
    return list(graph_def.node) + [n for f in graph_def.library.function for n in f.node_def]
