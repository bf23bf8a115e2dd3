"""sok.lookup_sparse against tf.nn.safe_embedding_lookup_sparse on the whole table."""
import numpy as np
import pytest
import tensorflow as tf

import sparse_operation_kit as sok
from conftest import assert_lookups_match, run_mode
from keras_optimizers import keras_optimizer, summed_duplicates

COMBINERS = ["sum", "mean", "sqrtn"]


ON_GPU = bool(tf.config.list_physical_devices("GPU"))
RUN_TIME_CHOICE_ON_CPU_ONLY = pytest.mark.skipif(
    ON_GPU, reason="tables on a GPU: the one-id choice is static there (a run-time choice "
                   "would wait for the device every step)")


def random_batch(rng, batch, vocab, max_len=4, id_dtype=tf.int64):
    """A ragged id batch (with empty rows) and matching positive weights."""
    lengths = rng.integers(0, max_len + 1, size=batch)
    if batch > 1:
        lengths[1] = 0  # always at least one empty sample
    ids = rng.integers(0, vocab, size=lengths.sum())
    weights = rng.uniform(0.5, 2.0, size=lengths.sum()).astype(np.float32)
    row_lengths = tf.constant(lengths, tf.int64)
    ragged_ids = tf.RaggedTensor.from_row_lengths(tf.constant(ids, id_dtype), row_lengths)
    ragged_weights = tf.RaggedTensor.from_row_lengths(tf.constant(weights), row_lengths)
    return ragged_ids, ragged_weights


def as_input(ragged, form):
    return ragged if form == "ragged" else ragged.to_sparse()


def reference(table, ids, weights, combiner):
    return tf.nn.safe_embedding_lookup_sparse(
        table, ids.to_sparse(), None if weights is None else weights.to_sparse(),
        combiner=combiner)


@pytest.mark.parametrize("mode", ["eager", "function"])
@pytest.mark.parametrize("id_dtype", [tf.int32, tf.int64])
@pytest.mark.parametrize("form", ["ragged", "sparse"])
@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("combiner", COMBINERS)
def test_matches_safe_embedding_lookup_sparse(combiner, weighted, form, id_dtype, mode):
    rng = np.random.default_rng(7)
    vocab, dim, batch = 40, 5, 9
    init = rng.normal(size=[vocab, dim]).astype(np.float32)
    table, ref_table = sok.Variable(init), tf.Variable(init)
    ids, weights = random_batch(rng, batch, vocab, id_dtype=id_dtype)
    weights = weights if weighted else None
    cotangent = tf.constant(rng.normal(size=[batch, dim]).astype(np.float32))

    def step():
        with tf.GradientTape(persistent=True) as tape:
            out = sok.lookup_sparse(
                [table], [as_input(ids, form)],
                None if weights is None else [as_input(weights, form)], [combiner])[0]
            ref = reference(ref_table, ids, weights, combiner)
            loss, ref_loss = tf.reduce_sum(out * cotangent), tf.reduce_sum(ref * cotangent)
        return out, ref, tape.gradient(loss, table), tape.gradient(ref_loss, ref_table)

    out, ref, grad, ref_grad = run_mode(mode, step)
    assert_lookups_match([out], [ref], [grad], [ref_grad], grad_atol=1e-6)


@pytest.mark.parametrize("batch_known", [True, False])
@pytest.mark.parametrize("combiner", COMBINERS)
def test_sparse_ids_as_given_on_a_gpu_match_tf(combiner, batch_known, monkeypatch):
    """With tables on a GPU a SparseTensor's row splits come from Sok>SparseRowSplits placed
    with the tables (on a GPU it searches the row ids; an order check would wait for the
    device): the same results, trailing and inner empty rows included. dense_shape, read in
    host memory, is the traced batch size where that is known (nothing to copy), else the
    SparseTensor's own. Run here on the CPU by telling lookup_sparse the tables are on a
    GPU."""
    from sparse_operation_kit import lookup_inputs
    monkeypatch.setattr(lookup_inputs, "table_on_gpu", lambda table: True)
    rng = np.random.default_rng(len(combiner))
    vocab, dim, batch = 30, 4, 50
    init = rng.normal(size=[vocab, dim]).astype(np.float32)
    table, ref_table = sok.Variable(init), tf.Variable(init)
    lengths = rng.integers(0, 5, size=batch)
    lengths[[1, -3, -2, -1]] = 0  # inner and trailing empty samples
    ids = tf.RaggedTensor.from_row_lengths(
        tf.constant(rng.integers(0, vocab, size=lengths.sum()), tf.int64), lengths)
    spec = tf.SparseTensorSpec([batch if batch_known else None, None], tf.int64)

    @tf.function(input_signature=[spec])
    def step(sparse):
        with tf.GradientTape(persistent=True) as tape:
            out = sok.lookup_sparse([table], [sparse], None, [combiner])[0]
            ref = reference(ref_table, ids, None, combiner)
            loss, ref_loss = tf.reduce_sum(out * out), tf.reduce_sum(ref * ref)
        return out, ref, tape.gradient(loss, table), tape.gradient(ref_loss, ref_table)

    out, ref, grad, ref_grad = step(ids.to_sparse())
    np.testing.assert_allclose(out.numpy(), ref.numpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(tf.convert_to_tensor(grad).numpy(),
                               tf.convert_to_tensor(ref_grad).numpy(), rtol=1e-5, atol=1e-5)
    ops = [op for op in step.get_concrete_function().graph.get_operations()
           if op.type == "Sok>SparseRowSplits"]
    assert len(ops) == 1
    shape = ops[0].inputs[1].op
    if batch_known:
        assert shape.type == "Const", shape.type
    else:
        assert shape.type == "Placeholder", shape.type  # the argument's dense_shape


@pytest.mark.parametrize("dim", [1, 3, 16, 128])
@pytest.mark.parametrize("combiner", COMBINERS)
def test_dimensions(dim, combiner):
    rng = np.random.default_rng(dim)
    init = rng.normal(size=[300, dim]).astype(np.float32)
    table, ref_table = sok.Variable(init), tf.Variable(init)
    ids, weights = random_batch(rng, 64, 300, max_len=9)
    out = sok.lookup_sparse([table], [ids], [weights], [combiner])[0]
    np.testing.assert_allclose(out.numpy(), reference(ref_table, ids, weights, combiner).numpy(),
                               rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("dedup_shares_table", [True, False])
def test_many_tables_and_shared_tables_in_one_call(dedup_shares_table):
    """Tables of two dimensions, one table used by two lookups; gradients add up."""
    rng = np.random.default_rng(3)
    shapes = [(30, 8), (12, 3), (50, 8)]
    inits = [rng.normal(size=s).astype(np.float32) for s in shapes]
    tables = [sok.Variable(v) for v in inits]
    refs = [tf.Variable(v) for v in inits]
    which = [0, 1, 2, 0] if dedup_shares_table else [0, 1, 2, 2]
    combiners = ["sum", "mean", "sqrtn", "mean"]
    batches = [random_batch(rng, 11, shapes[t][0])[0] for t in which]
    with tf.GradientTape(persistent=True) as tape:
        outs = sok.lookup_sparse([tables[t] for t in which], batches, combiners=combiners)
        ref_outs = [reference(refs[t], b, None, c) for t, b, c in zip(which, batches, combiners)]
        loss = sum(tf.reduce_sum(o * (i + 1)) for i, o in enumerate(outs))
        ref_loss = sum(tf.reduce_sum(o * (i + 1)) for i, o in enumerate(ref_outs))
    for out, ref in zip(outs, ref_outs):
        np.testing.assert_allclose(out.numpy(), ref.numpy(), rtol=1e-5, atol=1e-6)
    for grad, ref_grad in zip(tape.gradient(loss, tables), tape.gradient(ref_loss, refs)):
        np.testing.assert_allclose(tf.convert_to_tensor(grad).numpy(),
                                   tf.convert_to_tensor(ref_grad).numpy(), rtol=1e-5, atol=1e-6)


def test_gradients_of_large_batches_sorted_in_parallel_blocks():
    """Over 2^18 ids: the backward's counting sort splits the uses into blocks (one per
    core), a sample's ids may straddle blocks' rows; weighted mean and sqrtn, a shared
    table, a cotangent that differs per sample."""
    rng = np.random.default_rng(11)
    shapes = [(5000, 4), (300, 4)]
    inits = [rng.normal(size=s).astype(np.float32) for s in shapes]
    tables, refs = [sok.Variable(v) for v in inits], [tf.Variable(v) for v in inits]
    which, combiners, batch = [0, 1, 0], ["mean", "sqrtn", "sum"], 40000
    batches = [random_batch(rng, batch, shapes[t][0], max_len=6) for t in which]
    assert sum(int(ids.values.shape[0]) for ids, _ in batches) > 2 ** 18
    cotangents = [tf.constant(rng.normal(size=[batch, 4]).astype(np.float32)) for _ in which]
    with tf.GradientTape(persistent=True) as tape:
        outs = sok.lookup_sparse([tables[t] for t in which], [ids for ids, _ in batches],
                                 [w for _, w in batches], combiners)
        ref_outs = [reference(refs[t], ids, w, c)
                    for t, (ids, w), c in zip(which, batches, combiners)]
        loss = sum(tf.reduce_sum(o * c) for o, c in zip(outs, cotangents))
        ref_loss = sum(tf.reduce_sum(o * c) for o, c in zip(ref_outs, cotangents))
    for out, ref in zip(outs, ref_outs):
        np.testing.assert_allclose(out.numpy(), ref.numpy(), rtol=1e-5, atol=1e-5)
    for grad, ref_grad in zip(tape.gradient(loss, tables), tape.gradient(ref_loss, refs)):
        np.testing.assert_allclose(tf.convert_to_tensor(grad).numpy(),
                                   tf.convert_to_tensor(ref_grad).numpy(), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("mode", ["eager", "function"])
def test_zero_size_batch(mode):
    table = sok.Variable(np.ones([10, 4], np.float32))
    ids = tf.RaggedTensor.from_row_lengths(tf.zeros([0], tf.int64), tf.zeros([0], tf.int64))

    def step():
        with tf.GradientTape() as tape:
            out = sok.lookup_sparse([table], [ids], combiners=["mean"])[0]
            loss = tf.reduce_sum(out)
        return out, tape.gradient(loss, table)

    out, grad = run_mode(mode, step)
    assert out.shape == (0, 4)
    assert tf.reduce_sum(tf.abs(tf.convert_to_tensor(grad))).numpy() == 0.0


def test_all_empty_rows_give_zeros():
    table = sok.Variable(np.ones([10, 2], np.float32))
    ids = tf.ragged.constant([[], [], []], dtype=tf.int64, ragged_rank=1)
    for combiner in COMBINERS:
        out = sok.lookup_sparse([table], [ids], combiners=[combiner])[0]
        np.testing.assert_array_equal(out.numpy(), np.zeros([3, 2], np.float32))


def test_single_table_form():
    init = np.arange(20, dtype=np.float32).reshape(10, 2)
    ids = tf.ragged.constant([[1, 2], [9]], dtype=tf.int64)
    out = sok.lookup_sparse(sok.Variable(init), ids, combiners="sum")
    np.testing.assert_allclose(out.numpy(), np.stack([init[1] + init[2], init[9]]))


@pytest.mark.parametrize("mode", ["eager", "function"])
@pytest.mark.parametrize("dtype", [tf.float32, tf.float16])
def test_all2all_dense_embedding_matches_embedding_lookup(mode, dtype):
    rng = np.random.default_rng(11)
    init = tf.cast(rng.normal(size=[25, 6]), dtype)
    table, ref_table = sok.Variable(init), tf.Variable(init)
    indices = tf.constant(rng.integers(0, 25, size=[4, 3]), tf.int64)

    def step():
        with tf.GradientTape(persistent=True) as tape:
            out = sok.all2all_dense_embedding(table, indices)
            ref = tf.nn.embedding_lookup(ref_table, indices)
            loss, ref_loss = tf.reduce_sum(out * out), tf.reduce_sum(ref * ref)
        return out, ref, tape.gradient(loss, table), tape.gradient(ref_loss, ref_table)

    out, ref, grad, ref_grad = run_mode(mode, step)
    assert out.shape == (4, 3, 6) and out.dtype == dtype
    np.testing.assert_allclose(out.numpy(), ref.numpy(), rtol=1e-6)
    # float16: repeated ids' gradients summed in float32 here, in float16 by TF.
    np.testing.assert_allclose(tf.convert_to_tensor(grad).numpy(),
                               tf.convert_to_tensor(ref_grad).numpy(),
                               rtol=1e-5 if dtype == tf.float32 else 2e-3)


@pytest.mark.parametrize("mode", ["eager", "function"])
def test_all2all_dense_embedding_of_lists_and_ragged_ids(mode):
    """A list of tables (static of two dims, a dynamic one) with dense and ragged ids: each
    output equals the rows at its ids (NumPy), gradients equal tf.nn.embedding_lookup's."""
    rng = np.random.default_rng(12)
    inits = [rng.normal(size=[30, 4]).astype(np.float32),
             rng.normal(size=[20, 4]).astype(np.float32),
             rng.normal(size=[40, 8]).astype(np.float32)]
    tables = [sok.Variable(init) for init in inits]
    refs = [tf.Variable(init) for init in inits]
    dynamic = sok.DynamicVariable(dimension=4, initializer="zeros")
    keys = np.array([5, 70, 1 << 40, 9], np.int64)
    held = rng.normal(size=[4, 4]).astype(np.float32)
    sok.assign(dynamic, keys, held)
    indices = [tf.constant(rng.integers(0, 30, size=[3, 5]), tf.int32),
               tf.ragged.constant([[1, 19, 1], [], [7]], dtype=tf.int64),
               tf.constant(rng.integers(0, 40, size=[6]), tf.int64),
               tf.ragged.constant([[1 << 40], [9, 5, 70, 5]], dtype=tf.int64)]

    def step():
        with tf.GradientTape(persistent=True) as tape:
            outs = sok.all2all_dense_embedding(tables + [dynamic], indices)
            loss = tf.add_n([tf.reduce_sum(o.flat_values if isinstance(o, tf.RaggedTensor)
                                           else o) ** 2 for o in outs[:3]])
            ref_outs = [tf.nn.embedding_lookup(r, i.flat_values if isinstance(i, tf.RaggedTensor)
                                               else i) for r, i in zip(refs, indices[:3])]
            ref_loss = tf.add_n([tf.reduce_sum(o) ** 2 for o in ref_outs])
        grads = [tf.convert_to_tensor(g) for g in tape.gradient(loss, tables)]
        ref_grads = [tf.convert_to_tensor(g) for g in tape.gradient(ref_loss, refs)]
        return outs, grads, ref_grads

    outs, grads, ref_grads = run_mode(mode, step)
    assert outs[0].shape == (3, 5, 4)
    assert isinstance(outs[1], tf.RaggedTensor) and outs[1].shape.as_list() == [3, None, 4]
    np.testing.assert_array_equal(outs[1].row_lengths().numpy(), [3, 0, 1])
    assert outs[2].shape == (6, 8)
    for out, init, ids in zip(outs[:3], inits, indices[:3]):
        flat_out = out.flat_values if isinstance(out, tf.RaggedTensor) else out
        flat_ids = ids.flat_values if isinstance(ids, tf.RaggedTensor) else ids
        np.testing.assert_array_equal(flat_out.numpy(), init[flat_ids.numpy()])
    row_of = {int(k): held[i] for i, k in enumerate(keys)}
    np.testing.assert_array_equal(outs[3].flat_values.numpy(),
                                  np.stack([row_of[int(k)] for k in
                                            indices[3].flat_values.numpy()]))
    for grad, ref_grad in zip(grads, ref_grads):
        np.testing.assert_allclose(grad.numpy(), ref_grad.numpy(), rtol=1e-5, atol=1e-5)


def test_all2all_dense_embedding_list_needs_one_ids_entry_per_table():
    tables = [sok.Variable(np.ones([4, 2], np.float32)) for _ in range(2)]
    with pytest.raises(ValueError, match="one entry per table \\(2\\), got list of 1"):
        sok.all2all_dense_embedding(tables, [tf.constant([1])])
    with pytest.raises(TypeError, match="indices\\[1\\] have dtype float32"):
        sok.all2all_dense_embedding(tables, [tf.constant([1]), tf.constant([1.0])])


def test_gradient_matches_finite_differences():
    """The tape gradient equals central differences of the loss over every table entry."""
    rng = np.random.default_rng(5)
    init = rng.normal(size=[6, 3]).astype(np.float32)
    ids, weights = random_batch(rng, 5, 6)
    cotangent = tf.constant(rng.normal(size=[5, 3]).astype(np.float32))
    table = sok.Variable(init)

    def loss():
        out = sok.lookup_sparse([table], [ids], [weights], ["sqrtn"])[0]
        return tf.reduce_sum(out * cotangent)

    with tf.GradientTape() as tape:
        value = loss()
    theoretical = tf.convert_to_tensor(tape.gradient(value, table)).numpy()
    numerical = np.zeros_like(init)
    step = 0.5  # the loss is linear in the table, so a large step is exact
    for index in np.ndindex(*init.shape):
        for sign in (1, -1):
            perturbed = init.copy()
            perturbed[index] += sign * step
            table.assign(perturbed)
            numerical[index] += sign * loss().numpy() / (2 * step)
    np.testing.assert_allclose(theoretical, numerical, rtol=1e-4, atol=1e-4)


def test_large_outputs_reused_across_calls_hold_no_stale_values():
    # Outputs and gradients of this size come from recycled blocks (BlockPool): every call
    # must overwrite all of them, empty samples included, whatever the previous call left.
    rng = np.random.default_rng(21)
    vocab, dim, batch = 3000, 64, 2048  # [batch, dim] float32 = 512 KiB per output
    init = rng.normal(size=[vocab, dim]).astype(np.float32)
    table, ref_table = sok.Variable(init), tf.Variable(init)

    @tf.function
    def step(ids, cotangent):
        with tf.GradientTape(persistent=True) as tape:
            out = sok.lookup_sparse(table, ids, combiners="mean")
            ref = reference(ref_table, ids, None, "mean")
            loss, ref_loss = tf.reduce_sum(out * cotangent), tf.reduce_sum(ref * cotangent)
        return out, ref, tape.gradient(loss, table), tape.gradient(ref_loss, ref_table)

    for call in range(4):  # lengths change per call, so stale rows would show
        ids, _ = random_batch(rng, batch, vocab, max_len=2 + 3 * (call % 2))
        cotangent = tf.constant(rng.normal(size=[batch, dim]).astype(np.float32))
        out, ref, grad, ref_grad = step(ids, cotangent)
        np.testing.assert_allclose(out.numpy(), ref.numpy(), rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(tf.convert_to_tensor(grad).numpy(),
                                   tf.convert_to_tensor(ref_grad).numpy(), rtol=1e-5, atol=1e-5)


# Outputs above this many bytes are written with streamed (non-temporal) stores on the CPU
# (kStreamAboveBytes in kit_src/core/embedding/weighted_row_sum.h).
STREAM_ABOVE_BYTES = 8 << 20


@pytest.mark.parametrize("dim", [128, 136, 132])  # 32-column blocks; an 8-column tail; no vectors
@pytest.mark.parametrize("combiner", ["sum", "mean"])
def test_outputs_larger_than_the_caches_match_tf(dim, combiner):
    """Pooled outputs, their gradient over the unique rows and one-id outputs all above the
    size where the CPU streams its stores: samples of 0 to 20 weighted ids (sums of more
    than 16 rows take the plain loop), one-id batches chosen at run time and at trace time."""
    rng = np.random.default_rng(41)
    vocab, batch = 40000, 20000
    init = rng.normal(size=[vocab, dim]).astype(np.float32)
    table, ref_table = sok.Variable(init), tf.Variable(init)
    ids, weights = random_batch(rng, batch, vocab, max_len=20)
    assert batch * dim * 4 > STREAM_ABOVE_BYTES
    assert np.unique(ids.values.numpy()).size * dim * 4 > STREAM_ABOVE_BYTES
    cotangent = tf.constant(rng.normal(size=[batch, dim]).astype(np.float32))

    @tf.function
    def step(ids, weights):
        with tf.GradientTape(persistent=True) as tape:
            out = sok.lookup_sparse(table, ids, weights, combiners=combiner)
            ref = reference(ref_table, ids, weights, combiner)
            loss, ref_loss = tf.reduce_sum(out * cotangent), tf.reduce_sum(ref * cotangent)
        return out, ref, tape.gradient(loss, table), tape.gradient(ref_loss, ref_table)

    one_id_by_lengths = tf.RaggedTensor.from_row_lengths(
        tf.constant(rng.integers(0, vocab, size=batch)), tf.ones([batch], tf.int64))
    for ids, weights in [(ids, weights), (ids, None), (one_id_by_lengths, None),
                         (one_id_batch(rng, batch, vocab), None)]:
        out, ref, grad, ref_grad = step(ids, weights)
        np.testing.assert_allclose(out.numpy(), ref.numpy(), rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(tf.convert_to_tensor(grad).numpy(),
                                   tf.convert_to_tensor(ref_grad).numpy(), rtol=1e-4, atol=1e-4)


def one_id_batch(rng, batch, vocab, id_dtype=tf.int64):
    """Every sample holds one id, known at trace time: RaggedTensor.from_tensor of [batch, 1]."""
    ids = tf.constant(rng.integers(0, vocab, size=[batch, 1]), id_dtype)
    return tf.RaggedTensor.from_tensor(ids)


def shared_table_lookups(tables, ids, cotangents):
    """Three lookups, the first and third sharing table a, with COMBINERS: (sok outputs, TF's,
    sok gradients of a and b, TF's) for the loss sum(output * cotangent)."""
    a, b, ref_a, ref_b = tables
    with tf.GradientTape(persistent=True) as tape:
        outs = sok.lookup_sparse([a, b, a], ids, combiners=COMBINERS)
        refs = [reference(t, i, None, c) for t, i, c in zip([ref_a, ref_b, ref_a], ids,
                                                             COMBINERS)]
        loss = tf.add_n([tf.reduce_sum(o * c) for o, c in zip(outs, cotangents)])
        ref_loss = tf.add_n([tf.reduce_sum(r * c) for r, c in zip(refs, cotangents)])
    return outs, refs, tape.gradient(loss, [a, b]), tape.gradient(ref_loss, [ref_a, ref_b])


@pytest.mark.parametrize("mode", ["eager", "function"])
@pytest.mark.parametrize("id_dtype", [tf.int32, tf.int64])
def test_one_id_per_sample_path_matches_reference(id_dtype, mode):
    # Two lookups share table a; combiners differ (one row pools to itself under each).
    rng = np.random.default_rng(31)
    init_a, init_b = (rng.normal(size=[50, 8]).astype(np.float32) for _ in range(2))
    a, b, ref_a, ref_b = sok.Variable(init_a), sok.Variable(init_b), tf.Variable(init_a), \
        tf.Variable(init_b)
    ids = [one_id_batch(rng, 64, 50, id_dtype) for _ in range(3)]
    cotangents = [tf.constant(rng.normal(size=[64, 8]).astype(np.float32)) for _ in range(3)]

    def step():
        return shared_table_lookups((a, b, ref_a, ref_b), ids, cotangents)

    outs, refs, grads, ref_grads = run_mode(mode, step)
    for out, ref in zip(outs, refs):
        np.testing.assert_allclose(out.numpy(), ref.numpy(), rtol=1e-6)
    for grad, ref_grad in zip(grads, ref_grads):
        assert isinstance(grad, tf.IndexedSlices)  # sparse, also through tf.function
        np.testing.assert_allclose(tf.convert_to_tensor(grad).numpy(),
                                   tf.convert_to_tensor(ref_grad).numpy(), rtol=1e-5, atol=1e-6)


def test_one_id_per_sample_path_is_taken_statically_when_known():
    table = sok.Variable(np.ones([10, 4], np.float32))
    rng = np.random.default_rng(0)
    one_id = one_id_batch(rng, 6, 10)
    by_lengths = tf.RaggedTensor.from_row_lengths(one_id.values, tf.ones([6], tf.int64))

    def op_types(ids, weights=None):
        graph = tf.function(lambda i: sok.lookup_sparse(table, i, weights)).get_concrete_function(
            ids).graph
        return {op.type for op in graph.get_operations()}

    assert "Sok>GatherSingleIds" in op_types(one_id)
    assert "Sok>PartitionKeys" not in op_types(one_id)
    # One id each, but not known statically: on the CPU the choice is made per step (next
    # test); on a GPU the rows are pooled straight from the tables.
    if ON_GPU:
        assert "Sok>PoolFromTables" in op_types(by_lengths)
    else:
        assert {"If", "StatelessIf"} & op_types(by_lengths)


@pytest.mark.parametrize("form", ["one_id", "by_lengths", "ragged", "sparse"])
def test_traced_outputs_keep_the_static_batch_size(form):
    """Traced with ids whose batch size is static, every path's outputs state it too, so
    downstream shapes stay known and the gradient of a sum of an output is a constant that
    Grappler folds rather than a Tile of [batch, dim] a step."""
    rng = np.random.default_rng(3)
    table = sok.Variable(rng.normal(size=[30, 4]).astype(np.float32))
    one_id = one_id_batch(rng, 6, 30)
    ids = {"one_id": one_id,
           "by_lengths": tf.RaggedTensor.from_row_lengths(one_id.values, tf.ones([6], tf.int64)),
           "ragged": random_batch(rng, 6, 30)[0]}
    ids["sparse"] = ids["ragged"].to_sparse()
    spec = tf.type_spec_from_value(ids[form])
    assert spec.shape[0] == 6
    step = tf.function(lambda i: sok.lookup_sparse([table], [i], combiners=["sum"])[0])
    traced = step.get_concrete_function(spec).graph.outputs[0]
    assert traced.shape.as_list() == [6, 4]
    same_ids = one_id if form in ("one_id", "by_lengths") else ids["ragged"]
    np.testing.assert_allclose(step(ids[form]).numpy(), tf.nn.safe_embedding_lookup_sparse(
        table.numpy(), same_ids.to_sparse(), combiner="sum").numpy(), rtol=1e-6)


@RUN_TIME_CHOICE_ON_CPU_ONLY
@pytest.mark.parametrize("id_dtype", [tf.int32, tf.int64])
def test_one_id_per_sample_chosen_at_run_time(id_dtype):
    """RaggedTensors from row lengths, as a pipeline feeds them, through one traced step: where
    every sample holds one id, the rows come straight from the tables and the gradients are
    the outputs' own, over the ids as given (duplicates kept, as tf.gather gives); otherwise
    the fused chain runs and the gradients are over each table's unique ids. Outputs and
    gradients equal TensorFlow's either way; a table read by two lookups gets both."""
    rng = np.random.default_rng(5)
    init_a, init_b = (rng.normal(size=[40, 8]).astype(np.float32) for _ in range(2))
    a, b, ref_a, ref_b = (sok.Variable(init_a), sok.Variable(init_b), tf.Variable(init_a),
                          tf.Variable(init_b))

    @tf.function
    def step(ids, cotangents):
        return shared_table_lookups((a, b, ref_a, ref_b), ids, cotangents)

    # "paired": lookups 0 and 2 hold one id a sample, lookup 1 as many ids as samples but
    # two in one sample and none in the next: the fused chain must run.
    paired = np.tile(np.array([2, 0, 1], np.int64), 4)
    for kind in ["one", "ragged", "one", "paired", "ragged"]:
        one_id = kind == "one"
        lengths = [np.ones(12, np.int64) if one_id or (kind == "paired" and t != 1) else
                   paired if kind == "paired" else rng.integers(0, 4, size=12)
                   for t in range(3)]
        ids = [tf.RaggedTensor.from_row_lengths(
            tf.constant(rng.integers(0, 40, size=n.sum()), id_dtype), n) for n in lengths]
        cotangents = [tf.constant(rng.normal(size=[12, 8]).astype(np.float32)) for _ in range(3)]
        outs, refs, grads, ref_grads = step(ids, cotangents)
        assert_lookups_match(outs, refs, grads, ref_grads)
        a_ids = np.concatenate([ids[0].values.numpy(), ids[2].values.numpy()])
        if one_id:
            np.testing.assert_array_equal(grads[0].indices.numpy(), a_ids)
            np.testing.assert_array_equal(grads[0].values.numpy(),
                                          np.concatenate([cotangents[0].numpy(),
                                                          cotangents[2].numpy()]))
        else:
            np.testing.assert_array_equal(grads[0].indices.numpy(), np.unique(a_ids))
    assert step.experimental_get_tracing_count() == 1


def test_one_id_chosen_at_run_time_rejects_out_of_range_ids_and_updates_nothing():
    table = sok.Variable(np.ones([10, 4], np.float32), name="runtime_single")
    opt = keras_optimizer("SGD", 0.1)

    @tf.function
    def step(ids):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(sok.lookup_sparse(table, ids))
        opt.apply_gradients([(tape.gradient(loss, table), table)])

    for lengths, values in [([1, 1], [3, 10]), ([2, 0], [3, 10])]:
        ids = tf.RaggedTensor.from_row_lengths(tf.constant(values, tf.int64), lengths)
        with pytest.raises(tf.errors.InvalidArgumentError,
                           match="id 10 of table 'runtime_single.*' is out of range \\[0, 10\\)"):
            step(ids)
        np.testing.assert_array_equal(table.numpy(), np.ones([10, 4], np.float32))


def test_one_id_per_sample_path_rejects_out_of_range_ids():
    table = sok.Variable(np.ones([10, 4], np.float32), name="single")
    ids = tf.RaggedTensor.from_tensor(tf.constant([[3], [10]], tf.int64))
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match="id 10 of table 'single.*' is out of range \\[0, 10\\)"):
        sok.lookup_sparse(table, ids)


def test_one_id_per_sample_path_trains_like_tf_variable():
    # Repeated ids give IndexedSlices with duplicate indices, as tf.gather does; the optimizer
    # sums them (momentum checks that rows no sample used stay put).
    rng = np.random.default_rng(2)
    init = rng.normal(size=[30, 4]).astype(np.float32)
    table, ref = sok.Variable(init), tf.Variable(init)
    opt = keras_optimizer("SGD", 0.1, momentum=0.9)
    ref_opt = keras_optimizer("SGD", 0.1, momentum=0.9)

    @tf.function
    def step(ids):
        with tf.GradientTape(persistent=True) as tape:
            loss = tf.reduce_sum(sok.lookup_sparse(table, ids, combiners="sum") ** 2)
            ref_loss = tf.reduce_sum(tf.gather(ref, ids.values) ** 2)
        opt.apply_gradients([(tape.gradient(loss, table), table)])
        ref_opt.apply_gradients([(summed_duplicates(tape.gradient(ref_loss, ref)), ref)])

    for _ in range(8):
        step(one_id_batch(rng, 16, 12))  # only rows 0..11 are ever used
    np.testing.assert_allclose(table.numpy(), ref.numpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(table.numpy()[12:], init[12:])


def test_sparse_row_splits_match_from_sparse():
    """Sok>SparseRowSplits, for several SparseTensors in one op, against
    tf.RaggedTensor.from_sparse: leading, inner and trailing empty rows, no entries at all,
    no rows at all."""
    from sparse_operation_kit._ops import raw_ops
    rng = np.random.default_rng(11)
    cases = []
    for batch, max_len in [(1, 1), (9, 3), (200, 6), (5, 0), (0, 0)]:
        lengths = rng.integers(0, max_len + 1, size=batch)
        if batch > 2:
            lengths[[0, batch // 2, -1]] = 0
        ids = tf.constant(rng.integers(0, 100, size=lengths.sum()), tf.int64)
        cases.append(tf.RaggedTensor.from_row_lengths(ids, tf.constant(lengths, tf.int64)).to_sparse())
    made = raw_ops.sok_sparse_row_splits(indices=[s.indices for s in cases],
                                         dense_shape=[s.dense_shape for s in cases],
                                         names=[f"case {i}" for i in range(len(cases))])
    for sparse, row_splits in zip(cases, made):
        np.testing.assert_array_equal(row_splits.numpy(),
                                      tf.RaggedTensor.from_sparse(sparse).row_splits.numpy())


@pytest.mark.parametrize("mode", ["eager", "function"])
@pytest.mark.parametrize("combiner", COMBINERS)
def test_sparse_ids_with_gaps_between_columns_match_tf(combiner, mode):
    """A SparseTensor whose rows' columns are not 0, 1, ... (as parsed features with gaps
    give): sok reads the row ids only, as tf.nn.safe_embedding_lookup_sparse does, and
    matches it, outputs and gradients."""
    rng = np.random.default_rng(len(combiner))
    init = rng.normal(size=[40, 8]).astype(np.float32)
    table, ref_table = sok.Variable(init), tf.Variable(init)
    indices = tf.constant([[0, 2], [0, 7], [2, 0], [2, 5], [2, 9], [5, 3]], tf.int64)
    ids = tf.SparseTensor(indices, tf.constant(rng.integers(0, 40, size=6), tf.int64), [7, 10])
    weights = tf.SparseTensor(indices, tf.constant(rng.uniform(0.5, 2, size=6), tf.float32),
                              [7, 10])
    cotangent = tf.constant(rng.normal(size=[7, 8]).astype(np.float32))

    def step():
        with tf.GradientTape(persistent=True) as tape:
            out = sok.lookup_sparse([table, table], [ids, ids], [None, weights],
                                    [combiner, combiner])
            ref = [tf.nn.safe_embedding_lookup_sparse(ref_table, ids, w, combiner=combiner)
                   for w in (None, weights)]
            loss = tf.add_n([tf.reduce_sum(o * cotangent) for o in out])
            ref_loss = tf.add_n([tf.reduce_sum(r * cotangent) for r in ref])
        return out, ref, tape.gradient(loss, table), tape.gradient(ref_loss, ref_table)

    out, ref, grad, ref_grad = run_mode(mode, step)
    for o, r in zip(out, ref):
        np.testing.assert_allclose(o.numpy(), r.numpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(tf.convert_to_tensor(grad).numpy(),
                               tf.convert_to_tensor(ref_grad).numpy(), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("mode", ["eager", "function"])
def test_sparse_ids_out_of_order_or_outside_the_batch_are_refused(mode):
    """Rows out of order (an unsorted SparseTensor) or outside dense_shape[0], tables on the
    CPU (a GPU's search checks nothing, so as not to wait for the device): a clear error
    naming the lookup and the entry, and no update."""
    with tf.device("CPU:0"):
        table = sok.Variable(np.ones([10, 4], np.float32), name="sparse_order")
    opt = keras_optimizer("SGD", 0.1)
    good = tf.SparseTensor([[0, 0], [1, 0]], tf.constant([1, 2], tf.int64), [2, 1])

    def step(bad):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(sok.lookup_sparse([table, table], [good, bad])[1])
        opt.apply_gradients([(tape.gradient(loss, table), table)])

    unsorted = tf.SparseTensor([[1, 0], [0, 0], [2, 0]], tf.constant([1, 2, 3], tf.int64), [3, 1])
    outside = tf.SparseTensor([[0, 0], [3, 0]], tf.constant([1, 2], tf.int64), [3, 1])
    for bad, message in [(unsorted, r"sp_ids\[1\]: entry 1 is in row 0 after an entry of row 1"),
                         (outside, r"sp_ids\[1\]: entry 1 is in row 3, outside \[0, 3\)")]:
        with pytest.raises(tf.errors.InvalidArgumentError, match=message):
            run_mode(mode, lambda: step(bad))
        np.testing.assert_array_equal(table.numpy(), np.ones([10, 4], np.float32))


def test_sparse_row_splits_refuse_malformed_tensors():
    """Sok>SparseRowSplits called directly with what a SparseTensor cannot hold: errors name
    the tensor and the bad shape or value."""
    from sparse_operation_kit._ops import raw_ops
    indices = tf.constant([[0, 0], [1, 0]], tf.int64)
    for bad_indices, shape, message in [
            (indices, tf.constant([2], tf.int64), "t must be a 2-D SparseTensor; its dense_shape"),
            (tf.constant([0, 1], tf.int64), tf.constant([2, 1], tf.int64),
             r"t: indices must be \[nnz, 2\]"),
            (indices, tf.constant([-1, 1], tf.int64), r"t: dense_shape\[0\] is -1")]:
        with pytest.raises(tf.errors.InvalidArgumentError, match=message):
            raw_ops.sok_sparse_row_splits(indices=[bad_indices], dense_shape=[shape], names=["t"])
