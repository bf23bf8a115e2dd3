"""SOK's `sparse_operation_kit.utils`: small helpers over tables and TensorFlow."""
import tensorflow as tf

from sparse_operation_kit.dynamic_variable import DYNAMIC_TYPES
from sparse_operation_kit.variables import Variable

tf_version = tuple(int(part) for part in tf.__version__.split(".")[:2])


def is_sok_variable(variable):
    """Whether `variable` is a sok table (static or dynamic)."""
    return isinstance(variable, (Variable, *DYNAMIC_TYPES))


def filter_variables(variables):
    """Splits variables into (sok variables, other variables), keeping their order."""
    sok_vars, other_vars = [], []
    for variable in variables:
        (sok_vars if is_sok_variable(variable) else other_vars).append(variable)
    return sok_vars, other_vars


__all__ = ["tf_version", "filter_variables", "is_sok_variable"]
