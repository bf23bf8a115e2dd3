"""Loads the op library on first use, from this package's `lib/` directory.

Importing the package loads nothing; the first op call does, with a clear message when the
library is missing (not built) or was built against another TensorFlow.
"""
import os
import threading

import tensorflow as tf

# One library per TensorFlow version (major.minor): their C++ ABIs differ.
_TF_TAG = "tf" + ".".join(tf.__version__.split(".")[:2])
_LIBRARY = os.environ.get("SOK_OPS_LIBRARY") or os.path.join(
    os.path.dirname(os.path.abspath(__file__)), "lib", _TF_TAG, "libsok_ops.so")
_lock = threading.Lock()
_module = None


def _load():
    global _module
    with _lock:
        if _module is None:
            if not os.path.exists(_LIBRARY):
                raise ImportError(
                    f"sparse_operation_kit's op library for TensorFlow {tf.__version__} is missing at "
                    f"{_LIBRARY}; build it with "
                    "`make build` (or `pip install --no-build-isolation .`) in the source tree")
            try:
                _module = tf.load_op_library(_LIBRARY)
            except tf.errors.NotFoundError as error:
                raise ImportError(
                    f"could not load {_LIBRARY} into TensorFlow {tf.__version__}: {error}. It was "
                    "probably built against another TensorFlow; rebuild it with `make build`"
                ) from error
    return _module


class _RawOps:
    """The generated op wrappers (`sok.raw_ops.sok_partition_keys`, ...), loaded lazily."""

    def __getattr__(self, name):
        return getattr(_load(), name)

    def __dir__(self):
        return [name for name in dir(_load()) if name.startswith("sok_")]


raw_ops = _RawOps()
