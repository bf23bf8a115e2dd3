"""Optimizers the tests name once for both Keras generations.

Under Keras 2 (TensorFlow 2.15, or tf_keras) a test's optimizer is the legacy Keras class,
what SOK v2 scripts use; Keras 3 has no legacy optimizers, and there it is Keras 3's class of
the same name.
"""
import pytest
import tensorflow as tf

from sparse_operation_kit._versions import tf_keras_is_keras_3

KERAS_3 = tf_keras_is_keras_3()

keras_2_only = pytest.mark.skipif(KERAS_3, reason="tf.keras.optimizers.legacy is Keras 2 only")


def keras_optimizer(name, *args, **kwargs):
    """tf.keras.optimizers.legacy.<name> under Keras 2, tf.keras.optimizers.<name> under 3."""
    module = tf.keras.optimizers if KERAS_3 else tf.keras.optimizers.legacy
    return getattr(module, name)(*args, **kwargs)


def summed_duplicates(grad):
    """`grad` (IndexedSlices) with each index once, its rows summed: what TensorFlow's dense
    gradients and Keras 2's sparse updates apply. Keras 3's optimizers apply an IndexedSlices
    with repeated indices row by row instead, which is neither."""
    if not isinstance(grad, tf.IndexedSlices):
        return grad
    unique, position = tf.unique(grad.indices)
    values = tf.math.unsorted_segment_sum(grad.values, position, tf.size(unique))
    return tf.IndexedSlices(values, unique, grad.dense_shape)


class LazyMomentum:
    """Keras SGD-with-momentum on touched rows only (the new Keras SGD also moves untouched
    rows by their momentum): m = momentum m - lr g; w += m, or with nesterov
    w += momentum m - lr g."""

    def __init__(self, optimizer):
        self.lr, self.momentum, self.m = optimizer.learning_rate.numpy(), optimizer.momentum, {}
        self.nesterov = optimizer.nesterov

    def apply(self, table, rows, grads):
        values = table.numpy()
        for row, grad in zip(rows, grads):
            self.m[row] = self.momentum * self.m.get(row, 0.0) - self.lr * grad
            values[row] += (self.momentum * self.m[row] - self.lr * grad if self.nesterov
                            else self.m[row])
        table.assign(values)
