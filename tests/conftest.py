import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import pytest  # noqa: E402
import tensorflow as tf  # noqa: E402

import sparse_operation_kit as sok  # noqa: E402


ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


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
