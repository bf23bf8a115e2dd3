"""The fused dot interaction against the same interaction from TF ops."""
import numpy as np
import pytest
import tensorflow as tf

import sparse_operation_kit as sok
from sparse_operation_kit.interaction import dot_interaction_reference
from conftest import on


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


# On every device TensorFlow has here (the GPU's memory poisoned first).
@pytest.mark.parametrize("dtype", [tf.float32, tf.float16])
@pytest.mark.parametrize("batch, features, dim", [(5, 3, 4), (64, 27, 128), (3, 27, 512),
                                                  (0, 4, 8), (4, 1, 6)])
def test_interaction_matches_tf_ops(device, dtype, batch, features, dim):
    rng = np.random.default_rng(features)
    x = tf.constant(rng.normal(size=[batch, features, dim]), dtype)

    def run():
        with tf.GradientTape() as tape:
            tape.watch(x)
            out = sok.dot_interaction(x)
            loss = tf.reduce_sum(tf.cast(out, tf.float32) ** 2)
        return out, tape.gradient(loss, x)

    out, grad = on(device, run)
    x32 = tf.cast(x, tf.float32)
    with tf.device("CPU:0"), tf.GradientTape() as tape:  # float32 matmuls (not TF32)
        tape.watch(x32)
        dots = tf.matmul(x32, x32, transpose_b=True)
        lower = tf.constant(np.tril(np.ones([features, features]), -1).astype(bool))
        ref = tf.concat([x32[:, 0], tf.boolean_mask(dots, lower, axis=1)], 1)
        ref_loss = tf.reduce_sum(ref ** 2)
    ref_grad = tape.gradient(ref_loss, x32)
    tol = 1e-4 if dtype == tf.float32 else 3e-2
    np.testing.assert_allclose(tf.cast(out, tf.float32).numpy(), ref.numpy(), rtol=tol, atol=tol * 10)
    np.testing.assert_allclose(tf.cast(grad, tf.float32).numpy(), ref_grad.numpy(), rtol=tol,
                               atol=tol * 100)


# ---- bad input: the same errors on every device, nothing written


def test_interaction_without_features_is_refused(device):
    with pytest.raises(tf.errors.InvalidArgumentError, match="at least one vector"):
        on(device, lambda: sok.dot_interaction(tf.zeros([4, 0, 8])).numpy())
