"""SOK's `sparse_operation_kit.utils`: small helpers over tables and TensorFlow."""
import tensorflow as tf

from sparse_operation_kit.variables import filter_variables, is_sok_variable

tf_version = tuple(int(part) for part in tf.__version__.split(".")[:2])

__all__ = ["tf_version", "filter_variables", "is_sok_variable"]
