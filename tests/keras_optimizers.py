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
