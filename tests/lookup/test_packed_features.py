"""lookup_sparse of a feature-major packed batch (one RaggedTensor for every lookup, as
TorchRec's KeyedJaggedTensor) against the list form and tf.nn.safe_embedding_lookup_sparse."""
import numpy as np
import pytest
import tensorflow as tf

import sparse_operation_kit as sok
from conftest import run_mode
from keras_optimizers import keras_optimizer


def packed_batch(rng, vocabs, batch, max_len=4, splits_dtype=tf.int64):
    """(packed ids, packed weights, per-feature ragged ids, per-feature ragged weights)."""
    lengths = [rng.integers(0, max_len + 1, size=batch) for _ in vocabs]
    ids = [rng.integers(0, v, size=l.sum()) for v, l in zip(vocabs, lengths)]
    weights = [rng.uniform(0.5, 2.0, size=l.sum()).astype(np.float32) for l in lengths]
    all_lengths = np.concatenate(lengths)
    packed = tf.RaggedTensor.from_row_lengths(np.concatenate(ids).astype(np.int64),
                                              tf.constant(all_lengths, splits_dtype))
    packed_w = tf.RaggedTensor.from_row_lengths(np.concatenate(weights),
                                                tf.constant(all_lengths, splits_dtype))
    per_ids = [tf.RaggedTensor.from_row_lengths(i.astype(np.int64), l)
               for i, l in zip(ids, lengths)]
    per_w = [tf.RaggedTensor.from_row_lengths(w, l) for w, l in zip(weights, lengths)]
    return packed, packed_w, per_ids, per_w


@pytest.mark.parametrize("mode", ["eager", "function"])
@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("splits_dtype", [tf.int32, tf.int64])
def test_packed_batch_matches_safe_embedding_lookup_sparse(mode, weighted, splits_dtype):
    rng = np.random.default_rng(3)
    vocabs, dim, batch = [30, 7, 50, 12, 9], 6, 11
    inits = [rng.normal(size=[v, dim]).astype(np.float32) for v in vocabs]
    tables = [sok.Variable(i) for i in inits]
    tables[3] = sok.DynamicVariable(dimension=dim, initializer="zeros")
    refs = [tf.Variable(i) for i in inits]
    packed, packed_w, per_ids, per_w = packed_batch(rng, vocabs, batch,
                                                    splits_dtype=splits_dtype)
    combiners = ["sum", "mean", "sqrtn", "sum", "mean"]
    cotangent = tf.constant(rng.normal(size=[batch, len(vocabs), dim]).astype(np.float32))

    def step():
        with tf.GradientTape(persistent=True) as tape:
            out = sok.lookup_sparse(tables, packed, packed_w if weighted else None, combiners)
            loss = tf.reduce_sum(out * cotangent)
            refs_out = [tf.nn.safe_embedding_lookup_sparse(
                r, i.to_sparse(), w.to_sparse() if weighted else None, combiner=c)
                for r, i, w, c in zip(refs, per_ids, per_w, combiners)]
            ref_loss = tf.reduce_sum(tf.stack(refs_out, 1) * cotangent)
        static = [t for i, t in enumerate(tables) if i != 3]
        grads = [tf.convert_to_tensor(g) for g in tape.gradient(loss, static)]
        ref_grads = [tf.convert_to_tensor(g) for i, g in
                     enumerate(tape.gradient(ref_loss, refs)) if i != 3]
        return out, tf.stack(refs_out, 1), grads, ref_grads

    out, ref, grads, ref_grads = run_mode(mode, step)
    assert out.shape == (batch, len(vocabs), dim)
    ref = ref.numpy()
    ref[:, 3] = 0.0  # the dynamic table's rows start at zeros
    np.testing.assert_allclose(out.numpy(), ref, rtol=1e-5, atol=1e-6)
    for grad, ref_grad in zip(grads, ref_grads):
        np.testing.assert_allclose(grad.numpy(), ref_grad.numpy(), rtol=1e-5, atol=1e-6)


def test_packed_batch_equals_list_form_and_trains_alike():
    rng = np.random.default_rng(8)
    vocabs, dim, batch = [40, 40, 25], 4, 16
    inits = [rng.normal(size=[v, dim]).astype(np.float32) for v in vocabs]
    packed_tables = [sok.Variable(i) for i in inits]
    list_tables = [sok.Variable(i) for i in inits]
    opt_a = sok.OptimizerWrapper(keras_optimizer("Adam", 0.1))
    opt_b = sok.OptimizerWrapper(keras_optimizer("Adam", 0.1))
    for _ in range(3):
        packed, _, per_ids, _ = packed_batch(rng, vocabs, batch)
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(sok.lookup_sparse(packed_tables, packed, combiners="sum") ** 2)
        opt_a.apply_gradients(zip(tape.gradient(loss, packed_tables), packed_tables))
        with tf.GradientTape() as tape:
            outs = sok.lookup_sparse(list_tables, per_ids, combiners=["sum"] * 3)
            loss = tf.reduce_sum(tf.stack(outs, 1) ** 2)
        opt_b.apply_gradients(zip(tape.gradient(loss, list_tables), list_tables))
    for a, b in zip(packed_tables, list_tables):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("op", ["sok_unpack_features", "sok_unpack_features_from_host"])
@pytest.mark.parametrize("dtype,splits_dtype", [(np.int64, np.int64), (np.int32, np.int32),
                                                (np.float32, np.int64)])
def test_unpack_features_slices_and_rebases(op, dtype, splits_dtype):
    """Sok>UnpackFeatures(FromHost) against NumPy, unaligned feature starts included."""
    from sparse_operation_kit._ops import raw_ops
    lengths = np.array([1, 0, 3, 2, 2, 0, 1, 5, 0, 0, 4, 1])  # 3 features x batch 4
    values = (np.arange(lengths.sum()) * 10).astype(dtype)
    splits = np.concatenate([[0], np.cumsum(lengths)]).astype(splits_dtype)
    made_values, made_splits = getattr(raw_ops, op)(values=values, row_splits=splits,
                                                    num_features=3)
    for f in range(3):
        first, last = splits[4 * f], splits[4 * f + 4]
        np.testing.assert_array_equal(made_values[f].numpy(), values[first:last])
        np.testing.assert_array_equal(made_splits[f].numpy(), splits[4 * f:4 * f + 5] - first)


@pytest.mark.parametrize("op", ["sok_unpack_features", "sok_unpack_features_from_host"])
@pytest.mark.parametrize("ids", ["beyond int32", "within int32, multi-hot"])
def test_unpack_features_of_a_batch_staged_in_several_groups(op, ids):
    """A packed batch of several megabytes: on a GPU, Sok>UnpackFeaturesFromHost stages and
    copies it a few features at a time (each group's copy overlapping the next's staging),
    ids within int32 narrowed on the way."""
    from sparse_operation_kit._ops import raw_ops
    rng = np.random.default_rng(4)
    if ids == "beyond int32":
        features, batch, most, low, high = 7, 60_000, 4, 0, 1 << 40
    else:
        features, batch, most, low, high = 9, 50_000, 10, -5, 4_000_000
    lengths = rng.integers(0, most + 1, size=features * batch)
    values = rng.integers(low, high, size=lengths.sum())
    splits = np.concatenate([[0], np.cumsum(lengths)])
    made_values, made_splits = getattr(raw_ops, op)(values=values, row_splits=splits,
                                                    num_features=features)
    for f in range(features):
        first, last = splits[batch * f], splits[batch * (f + 1)]
        np.testing.assert_array_equal(made_values[f].numpy(), values[first:last])
        np.testing.assert_array_equal(made_splits[f].numpy(),
                                      splits[batch * f:batch * (f + 1) + 1] - first)


def _feature_batch(feature_lengths, feature_values, splits_dtype=np.int64):
    """A packed batch (values, row_splits) from each feature's sample lengths and values."""
    lengths = np.concatenate(feature_lengths)
    return (np.concatenate(feature_values),
            np.concatenate([[0], np.cumsum(lengths)]).astype(splits_dtype))


@pytest.mark.parametrize("splits_dtype", [np.int64, np.int32])
def test_unpack_features_from_host_codings(splits_dtype):
    """Each feature crosses as compactly as its contents allow (int64 ids within int32 as
    int32, sample lengths under 256 as bytes) and as it is otherwise; every coding comes back
    as NumPy slices it, int32's limits and ids that do not fit included."""
    from sparse_operation_kit._ops import raw_ops
    rng = np.random.default_rng(11)
    batch = 6
    limits = np.array([-2**31, 2**31 - 1, -1, 0, 7, 2**31 - 2], np.int64)
    feature_lengths = [
        np.ones(batch, np.int64),                      # fits: narrowed, byte lengths
        np.array([0, 255, 1, 0, 2, 3]),                # 255 ids in a sample: still a byte
        np.array([256, 0, 1, 2, 0, 1]),                # 256: int64 row splits
        np.zeros(batch, np.int64),                     # an empty feature
        np.array([1, 1, 2, 1, 1, 0]),                  # an id past int32: values as they are
    ]
    feature_values = [limits,
                      rng.integers(-2**31, 2**31, size=261),
                      rng.integers(0, 1000, size=260),
                      np.zeros(0, np.int64),
                      np.array([1, 2**31, 3, 4, -2**31 - 1, 5], np.int64)]
    values, splits = _feature_batch(feature_lengths, feature_values, splits_dtype)
    made_values, made_splits = raw_ops.sok_unpack_features_from_host(
        values=values, row_splits=splits, num_features=len(feature_lengths))
    for f, expected in enumerate(feature_values):
        np.testing.assert_array_equal(made_values[f].numpy(), expected)
        np.testing.assert_array_equal(made_splits[f].numpy(),
                                      np.concatenate([[0], np.cumsum(feature_lengths[f])]))


@pytest.mark.parametrize("dtype", [np.float64, np.float16, np.int32])
def test_unpack_features_from_host_keeps_other_dtypes_as_they_are(dtype):
    """Only int64 ids are narrowed: float64 weights with integral values, half weights and
    int32 ids cross bit for bit."""
    from sparse_operation_kit._ops import raw_ops
    feature_lengths = [np.array([2, 1]), np.array([1, 3])]
    feature_values = [np.array([1.0, 2.5, -3.0], dtype), np.array([4.0, 5.0, 6.25, 2.0**10], dtype)]
    if dtype == np.int32:
        feature_values = [np.array([1, -2, 2**31 - 1], dtype), np.array([4, 5, 6, -2**31], dtype)]
    values, splits = _feature_batch(feature_lengths, feature_values)
    made_values, made_splits = raw_ops.sok_unpack_features_from_host(
        values=values, row_splits=splits, num_features=2)
    for f, expected in enumerate(feature_values):
        np.testing.assert_array_equal(made_values[f].numpy(), expected)
        assert made_values[f].dtype.as_numpy_dtype == dtype


def test_unpack_features_from_host_keeps_decreasing_row_splits():
    """Row splits that decrease inside a feature cannot be sent as lengths: they cross as they
    are, so the lookup's check still names them."""
    from sparse_operation_kit._ops import raw_ops
    values = np.arange(6, dtype=np.int64)
    splits = np.array([0, 2, 1, 3, 6], np.int64)  # 2 features x batch 2; feature 0 decreases
    made_values, made_splits = raw_ops.sok_unpack_features_from_host(
        values=values, row_splits=splits, num_features=2)
    np.testing.assert_array_equal(made_splits[0].numpy(), [0, 2, 1])
    np.testing.assert_array_equal(made_splits[1].numpy(), [0, 2, 5])
    np.testing.assert_array_equal(made_values[1].numpy(), [1, 2, 3, 4, 5])


def test_packed_batch_bad_input():
    tables = [sok.Variable(np.ones([5, 2], np.float32)) for _ in range(3)]
    four_rows = tf.ragged.constant([[1], [2], [3], [4]], dtype=tf.int64)
    with pytest.raises(ValueError, match="holds 4 rows, which do not split into 3 features"):
        sok.lookup_sparse(tables, four_rows)
    with pytest.raises(ValueError, match="share one dimension"):
        sok.lookup_sparse(tables[:2] + [sok.Variable(np.ones([5, 3], np.float32))],
                          tf.ragged.constant([[1], [2], [3]], dtype=tf.int64))
    with pytest.raises(TypeError, match="ids must be int32 or int64"):
        sok.lookup_sparse(tables, tf.ragged.constant([[1.0], [2.0], [3.0]]))
    # rows unknown when traced: the op refuses at run time, naming the counts
    fn = tf.function(lambda r: sok.lookup_sparse(tables, r, combiners="sum"),
                     input_signature=[tf.RaggedTensorSpec([None, None], tf.int64, 1, tf.int64)])
    with pytest.raises(tf.errors.InvalidArgumentError, match="4 rows, which do not split into 3"):
        fn(four_rows)
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match="id 7 of table .* is out of range \\[0, 5\\)"):
        sok.lookup_sparse(tables, tf.ragged.constant([[1], [7], [3]], dtype=tf.int64))


def test_packed_batches_from_a_dataset_inside_the_step():
    """Batches read from a tf.data iterator inside a tf.function (host memory; on a GPU they
    cross through Sok>UnpackFeaturesFromHost) and batches already on the tables' device give
    the outputs of the list form."""
    rng = np.random.default_rng(4)
    vocabs, dim, batch = [20, 30], 3, 5
    inits = [rng.normal(size=[v, dim]).astype(np.float32) for v in vocabs]
    tables = [sok.Variable(i) for i in inits]
    batches = [packed_batch(rng, vocabs, batch) for _ in range(3)]
    with tf.device("CPU:0"):
        stacked = tf.concat([b[0] for b in batches], 0)
        per_batch = tf.RaggedTensor.from_uniform_row_length(stacked, batch * len(vocabs))
    iterator = iter(tf.data.Dataset.from_tensor_slices(per_batch))

    @tf.function
    def from_iterator():
        return sok.lookup_sparse(tables, next(iterator), combiners="mean")

    by_argument = tf.function(lambda packed: sok.lookup_sparse(tables, packed, combiners="mean"))
    for packed, _, per_ids, _ in batches:
        expected = tf.stack(sok.lookup_sparse(tables, per_ids, combiners=["mean"] * 2), 1)
        np.testing.assert_allclose(from_iterator().numpy(), expected.numpy(), rtol=1e-6)
        np.testing.assert_allclose(by_argument(packed).numpy(), expected.numpy(), rtol=1e-6)
