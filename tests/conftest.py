import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import pytest  # noqa: E402
import tensorflow as tf  # noqa: E402

import sparse_operation_kit as sok  # noqa: E402


@pytest.fixture(scope="session", autouse=True)
def single_worker():
    """The unit tests run as one worker; multi-worker tests launch their own processes."""
    if not sok.communication.is_initialized():
        sok.init(comm_tool="single")
    yield


def run_mode(mode, fn):
    """Calls fn eagerly or as a tf.function."""
    return fn() if mode == "eager" else tf.function(fn)()
