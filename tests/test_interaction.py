"""The fused dot interaction against the same interaction from TF ops."""
import numpy as np
import pytest
import tensorflow as tf

import sparse_operation_kit as sok
from sparse_operation_kit.interaction import dot_interaction_reference


@pytest.mark.parametrize("batch, num_features, dim", [(1, 2, 1), (5, 3, 4), (7, 27, 16),
                                                      (3, 27, 128), (0, 4, 8), (4, 9, 13)])
def test_values_and_gradients_match_tf_ops(batch, num_features, dim):
    rng = np.random.default_rng(batch * 100 + num_features)
    features = tf.constant(rng.normal(size=[batch, num_features, dim]).astype(np.float32))
    width = dim + num_features * (num_features - 1) // 2
    cotangent = tf.constant(rng.normal(size=[batch, width]).astype(np.float32))
    with tf.GradientTape(persistent=True) as tape:
        tape.watch(features)
        out = sok.dot_interaction(features)
        ref = dot_interaction_reference(features)
        loss, ref_loss = tf.reduce_sum(out * cotangent), tf.reduce_sum(ref * cotangent)
    assert out.shape == (batch, width)
    np.testing.assert_allclose(out.numpy(), ref.numpy(), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(tape.gradient(loss, features).numpy(),
                               tape.gradient(ref_loss, features).numpy(), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("batch, num_features, dim", [(5, 3, 4), (6, 27, 128), (0, 4, 8)])
def test_float16_is_accumulated_in_float32_and_rounded_once(batch, num_features, dim):
    # Reference: the float32 interaction of the same float16 values, rounded to float16. The
    # fused op may differ from it by one float16 rounding of the float32 sums.
    rng = np.random.default_rng(num_features)
    features = tf.constant(rng.normal(size=[batch, num_features, dim]), tf.float16)
    width = dim + num_features * (num_features - 1) // 2
    cotangent = tf.constant(rng.normal(size=[batch, width]), tf.float16)
    with tf.GradientTape(persistent=True) as tape:
        tape.watch(features)
        out = sok.dot_interaction(features)
        loss = tf.reduce_sum(tf.cast(out, tf.float32) * tf.cast(cotangent, tf.float32))
    wide = tf.cast(features, tf.float32)
    with tf.GradientTape() as ref_tape:
        ref_tape.watch(wide)
        ref = dot_interaction_reference(wide)
        ref_loss = tf.reduce_sum(ref * tf.cast(cotangent, tf.float32))
    grad, ref_grad = tape.gradient(loss, features), ref_tape.gradient(ref_loss, wide)
    assert out.dtype == tf.float16 and grad.dtype == tf.float16
    assert out.shape == (batch, width)
    half_ulp = 2.0 ** -11  # float16's relative rounding error
    np.testing.assert_allclose(out.numpy().astype(np.float32), ref.numpy(),
                               rtol=2 * half_ulp, atol=1e-3)
    np.testing.assert_allclose(grad.numpy().astype(np.float32), ref_grad.numpy(),
                               rtol=2 * half_ulp, atol=1e-3)


def test_gradient_matches_numeric_jacobian():
    features = tf.constant(np.random.default_rng(0).normal(size=[2, 4, 3]), tf.float32)
    theoretical, numerical = tf.test.compute_gradient(sok.dot_interaction, [features], delta=1e-2)
    np.testing.assert_allclose(theoretical[0], numerical[0], rtol=1e-2, atol=1e-2)


def test_inside_tf_function_and_bad_input():
    features = tf.ones([2, 3, 4])
    np.testing.assert_allclose(tf.function(sok.dot_interaction)(features).numpy(),
                               dot_interaction_reference(features).numpy())
    with pytest.raises(ValueError, match="features must be \\[batch, F, D\\]"):
        sok.dot_interaction(tf.ones([2, 3]))
    with pytest.raises(TypeError, match="float32 or float16 features, got float64"):
        sok.dot_interaction(tf.ones([2, 3, 4], tf.float64))
