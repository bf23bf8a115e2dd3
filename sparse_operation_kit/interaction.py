"""DLRM's dot interaction as one fused op (Sok>DotInteraction), with its gradient."""
import tensorflow as tf

from sparse_operation_kit._ops import raw_ops


def dot_interaction(features):
    """Fused DLRM dot interaction.

    Args:
      features: float32 or float16 [batch, F, D]; features[:, 0] is the bottom MLP's output.
        float16 (mixed precision) is accumulated in float32 and rounded once.

    Returns:
      [batch, D + F(F-1)/2]: features[:, 0], then features[:, i] . features[:, j] for each
      pair i > j in row-major lower-triangle order ((1,0), (2,0), (2,1), ...).
    """
    features = tf.convert_to_tensor(features)
    if features.dtype not in (tf.float32, tf.float16):
        raise TypeError(f"dot_interaction takes float32 or float16 features, got "
                        f"{features.dtype.name}")
    if features.shape.rank != 3:
        raise ValueError(f"features must be [batch, F, D], got shape {features.shape}")
    return raw_ops.sok_dot_interaction(features)


def dot_interaction_reference(features):
    """The same interaction from TF ops (batched matmul + lower-triangle gather)."""
    num_features = features.shape[1]
    products = tf.matmul(features, features, transpose_b=True)
    rows, cols = zip(*[(i, j) for i in range(1, num_features) for j in range(i)])
    flat = tf.reshape(products, [-1, num_features * num_features])
    pairs = tf.gather(flat, [i * num_features + j for i, j in zip(rows, cols)], axis=1)
    return tf.concat([features[:, 0], pairs], axis=1)


@tf.RegisterGradient("Sok>DotInteraction")
def _dot_interaction_grad(op, grad):
    return raw_ops.sok_dot_interaction_grad(op.inputs[0], grad)
