"""The static-table lookup chain and its id checks on every device TensorFlow has here.

On the CPU machine (CI) the device list is ["CPU"]; on the GPU machine ["CPU", "GPU"], and
every test then also runs with the ops placed on the GPU, checked against the same
references (TensorFlow's own ops, NumPy) and against the CPU kernels. GPU memory is filled
with NaN before each run, so an output element a kernel forgets to write shows up.
"""
import itertools

import numpy as np
import pytest
import tensorflow as tf

import sparse_operation_kit as sok
from sparse_operation_kit import raw_ops
from conftest import DEVICES, graph_nodes, on, poison
from keras_optimizers import keras_optimizer, summed_duplicates

COMBINERS = ["sum", "mean", "sqrtn"]
PACKED_ROW_BITS = 48


def ragged_batch(rng, batch, vocab, max_len, id_dtype=tf.int64, empty_rows=True):
    lengths = rng.integers(0 if empty_rows else 1, max_len + 1, size=batch)
    if empty_rows and batch > 1:
        lengths[1] = 0
    ids = rng.integers(0, vocab, size=lengths.sum())
    weights = rng.uniform(0.5, 2.0, size=lengths.sum()).astype(np.float32)
    row_lengths = tf.constant(lengths, tf.int64)
    return (tf.RaggedTensor.from_row_lengths(tf.constant(ids, id_dtype), row_lengths),
            tf.RaggedTensor.from_row_lengths(tf.constant(weights), row_lengths))


def tf_reference(refs, batches, weights, combiner, cotangents):
    """TensorFlow's pooled lookups on the CPU and the gradients of sum(out * cotangent)."""
    with tf.device("CPU:0"):
        with tf.GradientTape() as tape:
            outs = [tf.nn.safe_embedding_lookup_sparse(
                r, ids.to_sparse(), None if w is None else w.to_sparse(), combiner=combiner)
                for r, (ids, _), w in zip(refs, batches, weights)]
            loss = sum(tf.reduce_sum(o * c) for o, c in zip(outs, cotangents))
        return outs, tape.gradient(loss, refs)


def dense_grad(grad):
    return tf.convert_to_tensor(grad).numpy()


@pytest.mark.parametrize("mode", ["eager", "function"])
@pytest.mark.parametrize("combiner", COMBINERS)
@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("dim, id_dtype", [(1, tf.int64), (3, tf.int32), (16, tf.int64),
                                           (130, tf.int32)])
def test_lookup_matches_tf(device, mode, combiner, weighted, dim, id_dtype):
    rng = np.random.default_rng(dim * 7 + len(combiner))
    vocabs, batch = [50, 7, 300], 37
    inits = [rng.normal(size=[v, dim]).astype(np.float32) for v in vocabs]
    with tf.device(f"{device}:0"):  # ops on a resource run where it lives
        tables = [sok.Variable(init) for init in inits]
    with tf.device("CPU:0"):
        refs = [tf.Variable(init) for init in inits]
    batches = [ragged_batch(rng, batch, v, 5, id_dtype) for v in vocabs]
    weights = [w if weighted else None for _, w in batches]
    cotangents = [tf.constant(rng.normal(size=[batch, dim]).astype(np.float32)) for _ in vocabs]

    def step():
        with tf.GradientTape(persistent=True) as tape:
            outs = sok.lookup_sparse(tables, [ids for ids, _ in batches], weights,
                                     [combiner] * len(tables))
            loss = sum(tf.reduce_sum(o * c) for o, c in zip(outs, cotangents))
        return outs, tape.gradient(loss, tables)

    outs, grads = on(device, step if mode == "eager" else tf.function(step))
    ref_outs, ref_grads = tf_reference(refs, batches, weights, combiner, cotangents)
    for out, ref, grad, ref_grad in zip(outs, ref_outs, grads, ref_grads):
        assert device in out.device
        np.testing.assert_allclose(out.numpy(), ref.numpy(), rtol=1e-5, atol=1e-5)
        assert isinstance(grad, tf.IndexedSlices)
        np.testing.assert_allclose(dense_grad(grad), dense_grad(ref_grad), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("form", ["ragged", "sparse"])
@pytest.mark.parametrize("combiner", COMBINERS)
@pytest.mark.parametrize("dim", [4, 128, 130])
def test_hot_rows_and_sparse_ids_match_tf(device, form, combiner, dim):
    """Zipf ids, so a few rows take thousands of uses (the GPU backward sums sorted uses in
    chunks: a hot row spans many), trailing empty samples, weighted lookups, and ids given
    as a SparseTensor (on a GPU its row splits come from a search, not from_sparse)."""
    rng = np.random.default_rng(dim + len(combiner) + len(form))
    vocabs, batch = [3, 1000, 5000], 3001
    inits = [rng.normal(size=[v, dim]).astype(np.float32) for v in vocabs]
    with tf.device(f"{device}:0"):
        tables = [sok.Variable(init) for init in inits]
    with tf.device("CPU:0"):
        refs = [tf.Variable(init) for init in inits]
    lengths = rng.integers(0, 7, size=batch)
    lengths[-5:] = 0
    row_lengths = tf.constant(lengths, tf.int64)
    batches = [(tf.RaggedTensor.from_row_lengths(
                    tf.constant((rng.zipf(1.3, size=lengths.sum()) - 1) % v, tf.int64),
                    row_lengths),
                tf.RaggedTensor.from_row_lengths(
                    tf.constant(rng.uniform(0.5, 2.0, size=lengths.sum()).astype(np.float32)),
                    row_lengths)) for v in vocabs]
    weights = [None, batches[1][1], None]
    given = [(ids if form == "ragged" else ids.to_sparse(),
              None if w is None else (w if form == "ragged" else w.to_sparse()))
             for (ids, _), w in zip(batches, weights)]
    cotangents = [tf.constant(rng.normal(size=[batch, dim]).astype(np.float32)) for _ in vocabs]

    def step():
        with tf.GradientTape() as tape:
            outs = sok.lookup_sparse(tables, [ids for ids, _ in given], [w for _, w in given],
                                     [combiner] * len(tables))
            loss = sum(tf.reduce_sum(o * c) for o, c in zip(outs, cotangents))
        return outs, tape.gradient(loss, tables)

    outs, grads = on(device, tf.function(step))
    ref_outs, ref_grads = tf_reference(refs, batches, weights, combiner, cotangents)
    for out, ref, grad, ref_grad in zip(outs, ref_outs, grads, ref_grads):
        assert device in out.device
        np.testing.assert_allclose(out.numpy(), ref.numpy(), rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(dense_grad(grad), dense_grad(ref_grad), rtol=1e-4, atol=1e-3)


@pytest.mark.parametrize("id_dtype", [tf.int32, tf.int64])
@pytest.mark.parametrize("dim", [2, 32, 128])
def test_one_id_path_matches_gather(device, id_dtype, dim):
    rng = np.random.default_rng(dim)
    vocabs, batch = [1000, 3], 4099
    inits = [rng.normal(size=[v, dim]).astype(np.float32) for v in vocabs]
    with tf.device(f"{device}:0"):
        tables = [sok.Variable(init) for init in inits]
    ids = [tf.constant(rng.integers(0, v, size=batch), id_dtype) for v in vocabs]

    @tf.function
    def step():
        with tf.GradientTape() as tape:
            outs = sok.lookup_sparse(tables, [tf.RaggedTensor.from_tensor(i[:, None]) for i in ids],
                                     combiners=["sum", "mean"])
            loss = sum(tf.reduce_sum(o * o) for o in outs)
        return outs, tape.gradient(loss, tables)

    outs, grads = on(device, step)
    for out, init, i, grad in zip(outs, inits, ids, grads):
        expected = init[i.numpy()]
        np.testing.assert_array_equal(out.numpy(), expected)
        dense = np.zeros_like(init)
        np.add.at(dense, i.numpy(), 2 * expected)
        np.testing.assert_allclose(dense_grad(grad), dense, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("num_workers, owners, dedup", [(1, [-1, -1], True), (3, [-1, 1], True),
                                                        (2, [-1, 0], False)])
def test_partition_keys_routes_every_id(device, num_workers, owners, dedup):
    rng = np.random.default_rng(num_workers)
    rows = [1000, 17]
    ids = [rng.integers(0, rows[0], size=3000), rng.integers(0, rows[1], size=500),
           rng.integers(0, rows[0], size=7)]
    lookup_table = [0, 1, 0]

    def partition():
        return raw_ops.sok_partition_keys(
            ids=[tf.constant(i, tf.int64) for i in ids], lookup_table=lookup_table,
            table_rows=rows, table_owner=owners, table_names=["a", "b"],
            num_workers=num_workers, dedup=dedup)

    send_keys, splits, position, table_counts = [t.numpy() for t in on(device, partition)]
    assert splits.sum() == len(send_keys)
    # One worker: the keys of each table, for the gradient's split; several: none.
    expected_counts = (np.bincount(send_keys >> PACKED_ROW_BITS, minlength=2)
                       if num_workers == 1 else np.zeros([0]))
    np.testing.assert_array_equal(table_counts, expected_counts)
    flat = np.concatenate(ids)
    tables = np.concatenate([[t] * len(i) for t, i in zip(lookup_table, ids)])
    owner = np.where(np.array(owners)[tables] >= 0, np.array(owners)[tables], flat % num_workers)
    local = np.where(np.array(owners)[tables] >= 0, flat, flat // num_workers)
    # Every id's position names its (table, local row) key, in its owner's block.
    np.testing.assert_array_equal(send_keys[position], (tables << PACKED_ROW_BITS) | local)
    starts = np.concatenate([[0], np.cumsum(splits)])
    assert np.all((starts[owner] <= position) & (position < starts[owner + 1]))
    pairs = set(zip(tables.tolist(), flat.tolist()))
    assert len(send_keys) == (len(pairs) if dedup else len(flat))
    # Within a worker's block the keys are grouped by table.
    for w in range(num_workers):
        block = send_keys[starts[w]:starts[w + 1]] >> PACKED_ROW_BITS
        assert np.all(np.diff(block) >= 0)


@pytest.mark.parametrize("attrs, message", [
    (dict(table_owner=[-1]), r"table_rows, table_owner and table_names must have one entry"),
    (dict(table_dynamic=[False, False, False]), r"table_dynamic needs one entry per table"),
    (dict(table_owner=[-1, 2]), r"table 'b' is placed on worker 2 but there are 2"),
    (dict(lookup_table=[0, 1]), r"lookup_table needs one entry per ids input, got 2 for 1")])
def test_partition_keys_refuses_placements_that_do_not_fit(device, attrs, message):
    """The tables' placement attrs are checked before any id is read."""
    args = dict(ids=[tf.constant([0, 1], tf.int64)], lookup_table=[1], table_rows=[4, 3],
                table_owner=[-1, 1], table_names=["a", "b"], num_workers=2,
                table_dynamic=[False, False])
    args.update(attrs)
    with pytest.raises(tf.errors.InvalidArgumentError, match=message):
        on(device, lambda: raw_ops.sok_partition_keys(**args))


@pytest.mark.parametrize("grouped, counted", [(True, False), (True, True), (False, False)])
def test_gather_rows_and_split_gradient(device, grouped, counted):
    """Rows gathered by packed key; their gradient split by table, counted on the device or
    from given table_counts (keys grouped by table, as Sok>PartitionKeys lays them out)."""
    rng = np.random.default_rng(5)
    dim = 12
    inits = [rng.normal(size=[r, dim]).astype(np.float32) for r in (30, 5, 9)]
    with tf.device(f"{device}:0"):
        shards = [tf.Variable(init) for init in inits]
    tables = rng.integers(0, 3, size=200)
    tables = np.sort(tables) if grouped else tables
    local = np.array([rng.integers(0, len(inits[t])) for t in tables])
    keys = tf.constant((tables << PACKED_ROW_BITS) | local, tf.int64)
    grad = tf.constant(rng.normal(size=[len(tables), dim]).astype(np.float32))

    def run():
        rows = raw_ops.sok_gather_shard_rows(shards=[s.handle for s in shards], keys=keys,
                                             dtype=tf.float32, dim=dim)
        counts = (np.bincount(tables, minlength=3) if counted else np.zeros([0])).astype(np.int32)
        indices, values = raw_ops.sok_split_gradient_by_table(
            keys=keys, grad=grad, table_counts=tf.constant(counts), num_tables=3)
        return rows, indices, values

    rows, indices, values = on(device, run)
    np.testing.assert_array_equal(rows.numpy(), np.stack([inits[t][r] for t, r in zip(tables, local)]))
    for t in range(3):
        mine = np.nonzero(tables == t)[0]
        np.testing.assert_array_equal(indices[t].numpy(), local[mine])
        np.testing.assert_array_equal(values[t].numpy(), grad.numpy()[mine])


@pytest.mark.parametrize("counts, message", [
    ([3, 1], r"table_counts must be empty or hold 3 counts"),
    ([3, -1, 2], r"table_counts\[1\] = -1 is negative"),
    ([3, 1, 1], r"table_counts add up to 5, not the 4 keys")])
def test_split_gradient_refuses_table_counts_that_cannot_describe_the_keys(device, counts,
                                                                           message):
    keys = tf.constant([(t << PACKED_ROW_BITS) | 1 for t in (0, 0, 0, 2)], tf.int64)
    with pytest.raises(tf.errors.InvalidArgumentError, match=message):
        on(device, lambda: raw_ops.sok_split_gradient_by_table(
            keys=keys, grad=tf.ones([4, 2]), table_counts=tf.constant(counts, tf.int32),
            num_tables=3))


def test_split_gradient_on_the_cpu_checks_given_counts_against_the_keys():
    """The GPU trusts Sok>PartitionKeys' counts; the CPU checks them against the keys."""
    keys = tf.constant([(t << PACKED_ROW_BITS) | 1 for t in (0, 0, 0, 2)], tf.int64)
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"do not describe the keys"):
        on("CPU", lambda: raw_ops.sok_split_gradient_by_table(
            keys=keys, grad=tf.ones([4, 2]), table_counts=tf.constant([2, 1, 1], tf.int32),
            num_tables=3))


@pytest.mark.parametrize("dtype", [tf.float16, tf.bfloat16])
@pytest.mark.parametrize("dim", [1, 6, 7, 16])
def test_gather_rows_of_16bit_tables_bit_for_bit(device, dtype, dim):
    """16-bit shards are copied bit for bit (odd widths value by value, even ones as word
    pairs on the GPU); a key naming no row fails and names it."""
    rng = np.random.default_rng(dim)
    inits = [tf.cast(rng.normal(size=[r, dim]), dtype) for r in (30, 5)]
    with tf.device(f"{device}:0"):
        shards = [tf.Variable(init) for init in inits]
    tables = rng.integers(0, 2, size=100)
    local = np.array([rng.integers(0, inits[t].shape[0]) for t in tables])
    keys = tf.constant((tables << PACKED_ROW_BITS) | local, tf.int64)
    rows = on(device, lambda: raw_ops.sok_gather_shard_rows(
        shards=[s.handle for s in shards], keys=keys, dtype=dtype, dim=dim))
    assert rows.dtype == dtype
    expected = np.stack([inits[t].numpy()[r] for t, r in zip(tables, local)])
    np.testing.assert_array_equal(rows.numpy().view(np.uint16), expected.view(np.uint16))
    bad = tf.constant([1, (1 << PACKED_ROW_BITS) | 5], tf.int64)
    with pytest.raises(tf.errors.InvalidArgumentError, match="key 281474976710661"):
        on(device, lambda: raw_ops.sok_gather_shard_rows(
            shards=[s.handle for s in shards], keys=bad, dtype=dtype, dim=dim).numpy())


def one_rounding(dtype):
    """The spacing of `dtype` values in [1, 2): the error of one rounding, relative."""
    return {tf.float16: 2.0 ** -10, tf.bfloat16: 2.0 ** -7}[dtype]


@pytest.mark.parametrize("mode", ["eager", "function"])
@pytest.mark.parametrize("dtype", [tf.float16, tf.bfloat16])
@pytest.mark.parametrize("combiner", COMBINERS)
@pytest.mark.parametrize("weighted, one_id", [(False, False), (True, False), (False, True)])
@pytest.mark.parametrize("dim", [3, 16])
def test_16bit_tables_pool_in_float32_and_round_once(device, mode, dtype, combiner, weighted,
                                                     one_id, dim):
    """A float16 / bfloat16 sok.Variable: outputs in its dtype, equal to TF's float32 lookup
    of the same (rounded) rows rounded once; each touched row's gradient is the float32 sum
    rounded once, as IndexedSlices in the table's dtype."""
    rng = np.random.default_rng(dim + len(combiner) + 10 * weighted)
    vocabs, batch = [40, 9], 33
    inits = [tf.cast(rng.normal(size=[v, dim]), dtype) for v in vocabs]
    with tf.device(f"{device}:0"):
        tables = [sok.Variable(init) for init in inits]
    with tf.device("CPU:0"):
        refs = [tf.Variable(tf.cast(init, tf.float32)) for init in inits]
    if one_id:
        batches = [(tf.RaggedTensor.from_tensor(
            tf.constant(rng.integers(0, v, size=[batch, 1]), tf.int64)), None) for v in vocabs]
    else:
        batches = [ragged_batch(rng, batch, v, 4) for v in vocabs]
    weights = [w if weighted else None for _, w in batches]
    # Representable in dtype: the outputs' gradients arrive in it.
    cotangents = [tf.cast(tf.cast(rng.normal(size=[batch, dim]), dtype), tf.float32)
                  for _ in vocabs]

    def step():
        with tf.GradientTape() as tape:
            outs = sok.lookup_sparse(tables, [ids for ids, _ in batches], weights,
                                     [combiner] * len(tables))
            loss = sum(tf.reduce_sum(tf.cast(o, tf.float32) * c)
                       for o, c in zip(outs, cotangents))
        return outs, tape.gradient(loss, tables)

    outs, grads = on(device, step if mode == "eager" else tf.function(step))
    ref_outs, ref_grads = tf_reference(refs, batches, weights, combiner, cotangents)
    eps = one_rounding(dtype)
    for out, ref, grad, ref_grad in zip(outs, ref_outs, grads, ref_grads):
        assert device in out.device and out.dtype == dtype
        rounded = tf.cast(tf.cast(ref, dtype), tf.float32).numpy()
        np.testing.assert_allclose(tf.cast(out, tf.float32).numpy(), rounded, rtol=eps,
                                   atol=1e-6)
        assert isinstance(grad, tf.IndexedSlices) and grad.values.dtype == dtype
        rounded_grad = tf.cast(tf.cast(dense_grad(ref_grad), dtype), tf.float32).numpy()
        np.testing.assert_allclose(tf.cast(dense_grad(grad), tf.float32).numpy(),
                                   rounded_grad, rtol=eps, atol=1e-5)


@pytest.mark.parametrize("dtype", [tf.float16, tf.bfloat16])
def test_16bit_tables_train_like_keras_on_a_16bit_variable(device, dtype):
    """The wrapper hands 16-bit tables to the wrapped optimizer (Sok>StaticApply is
    float32): three legacy Adam steps equal Keras' on a tf.Variable of the same dtype fed
    by TF's own lookup, to a few roundings."""
    rng = np.random.default_rng(11)
    init = tf.cast(rng.normal(size=[30, 8]), dtype)
    with tf.device(f"{device}:0"):
        table = sok.Variable(init)
        ref = tf.Variable(init)
    optimizer = sok.OptimizerWrapper(keras_optimizer("Adam", 0.05))
    ref_optimizer = keras_optimizer("Adam", 0.05)
    ids = ragged_batch(rng, 16, 30, 3)[0]
    target = tf.constant(rng.normal(size=[16, 8]), dtype)

    def step():
        with tf.GradientTape() as tape:
            out = sok.lookup_sparse([table], [ids], combiners=["sum"])[0]
            loss = tf.reduce_sum(tf.square(tf.cast(out - target, tf.float32)))
        optimizer.apply_gradients(zip(tape.gradient(loss, [table]), [table]))
        with tf.GradientTape() as tape:
            out = tf.nn.safe_embedding_lookup_sparse(ref, ids.to_sparse(), combiner="sum")
            loss = tf.reduce_sum(tf.square(tf.cast(out - target, tf.float32)))
        ref_optimizer.apply_gradients([(summed_duplicates(tape.gradient(loss, ref)), ref)])

    for _ in range(3):
        on(device, step)
    after = tf.cast(table, tf.float32).numpy()
    np.testing.assert_allclose(after, tf.cast(ref, tf.float32).numpy(),
                               atol=8 * one_rounding(dtype) * np.abs(after).max())
    untouched = np.setdiff1d(np.arange(30), ids.values.numpy())
    np.testing.assert_array_equal(after[untouched], tf.cast(init, tf.float32).numpy()[untouched])


@pytest.mark.parametrize("dim", [1, 8, 33])
def test_combine_forward_and_backward_raw(device, dim):
    """The exchange path's combine: pooling rows by position, and its gradient."""
    rng = np.random.default_rng(dim)
    num_rows, batch = 40, 23
    rows = rng.normal(size=[num_rows, dim]).astype(np.float32)
    ids, weights = ragged_batch(rng, batch, num_rows, 6)
    position = ids.values.numpy().astype(np.uint32)
    splits = ids.row_splits.numpy()
    w = weights.values.numpy()
    grad = rng.normal(size=[batch, dim]).astype(np.float32)
    combiners = ["sum", "mean", "sqrtn"]

    def run():
        outs = raw_ops.sok_combine_forward(
            rows=rows, position=np.concatenate([position] * 3),
            row_splits=[splits] * 3, weights=[w, np.zeros([0], np.float32), w],
            combiners=combiners)
        back = raw_ops.sok_combine_backward(
            output_grads=[grad] * 3, position=np.concatenate([position] * 3),
            row_splits=[splits] * 3, weights=[w, np.zeros([0], np.float32), w],
            num_rows=np.int64(num_rows), combiners=combiners)
        return outs, back

    outs, back = on(device, run)
    expected_back = np.zeros_like(rows)
    for c, (combiner, weighted) in enumerate(zip(combiners, [True, False, True])):
        expected = np.zeros([batch, dim], np.float32)
        for s in range(batch):
            use = slice(splits[s], splits[s + 1])
            ww = w[use] if weighted else np.ones(splits[s + 1] - splits[s], np.float32)
            denominator = {"sum": 1.0, "mean": ww.sum(), "sqrtn": np.sqrt((ww * ww).sum())}[combiner]
            if len(ww) == 0 or denominator == 0:
                continue
            expected[s] = (ww[:, None] * rows[position[use]]).sum(0) / denominator
            np.add.at(expected_back, position[use], ww[:, None] * grad[s] / denominator)
        np.testing.assert_allclose(outs[c].numpy(), expected, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(back.numpy(), expected_back, rtol=1e-4, atol=1e-5)


def test_one_id_path_of_many_lookups(device):
    """40 one-id lookups (more than a GPU launch carries in its parameters: two batches) equal
    tf.gather; a bad id in the second batch names its own table, id and range."""
    rng = np.random.default_rng(40)
    vocabs = [int(v) for v in rng.integers(5, 300, size=40)]
    inits = [rng.normal(size=[v, 3]).astype(np.float32) for v in vocabs]
    with tf.device(f"{device}:0"):
        tables = [sok.Variable(init, name=f"t{i}") for i, init in enumerate(inits)]
    ids = [rng.integers(0, v, size=int(rng.integers(0, 50))) for v in vocabs]
    rows = on(device, lambda: sok.lookup_sparse(
        tables, [tf.RaggedTensor.from_tensor(tf.constant(i, tf.int64)[:, None]) for i in ids],
        combiners=["sum"] * 40))
    for out, init, i in zip(rows, inits, ids):
        np.testing.assert_array_equal(out.numpy(), init[i].reshape(-1, 3))
    ids[37] = np.array([0, vocabs[37] + 4])
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match=rf"id {vocabs[37] + 4} of table 't37:0' is out of range "
                             rf"\[0, {vocabs[37]}\)"):
        on(device, lambda: [o.numpy() for o in sok.lookup_sparse(
            tables, [tf.RaggedTensor.from_tensor(tf.constant(i, tf.int64)[:, None])
                     for i in ids], combiners=["sum"] * 40)])


@pytest.mark.parametrize("failed", [False, True])
def test_guard_ids_passes_ids_or_blocks_them_all(device, failed):
    """Sok>GuardIds over 40 lookups (two GPU batches): the ids as they are after a clean check
    record, -1 everywhere after one holding an error."""
    rng = np.random.default_rng(3)
    ids = [tf.constant(rng.integers(0, 1000, size=int(rng.integers(0, 70))), tf.int64)
           for _ in range(40)]
    # LookupCheck: first_bad (kNoError = all ones), value_a, value_b.
    check = tf.constant([5 << 44, 7, 9] if failed else [-1, 0, 0], tf.int64)
    guarded = on(device, lambda: raw_ops.sok_guard_ids(ids=ids, check=check))
    for g, i in zip(guarded, ids):
        np.testing.assert_array_equal(g.numpy(), -np.ones_like(i.numpy()) if failed else i.numpy())
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"check must hold 3 values"):
        on(device, lambda: raw_ops.sok_guard_ids(ids=ids[:2], check=tf.constant([-1], tf.int64)))


@pytest.mark.parametrize("one_id", [False, True])
@pytest.mark.parametrize("bad_id", [10, -1, 1 << 40])
def test_out_of_range_id(device, one_id, bad_id):
    with tf.device(f"{device}:0"):
        table = sok.Variable(tf.zeros([10, 4]), name="users")
    values = tf.constant([1, bad_id, 2], tf.int64)
    ids = (tf.RaggedTensor.from_tensor(values[:, None]) if one_id
           else tf.RaggedTensor.from_row_lengths(values, [2, 1]))
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match=rf"id {bad_id} of table 'users:0' is out of range \[0, 10\)"):
        on(device, lambda: sok.lookup_sparse([table], [ids])[0].numpy())


@pytest.mark.parametrize("one_id", [False, True])
def test_bad_id_in_a_training_step_changes_nothing(device, one_id):
    """In a tf.function the step fails and no update lands (the one-id path's gradients wait
    for Sok>CheckGatheredIds; the fused chain's partition fails before anything runs)."""
    init = np.arange(40, dtype=np.float32).reshape(10, 4)
    with tf.device(f"{device}:0"):
        table = sok.Variable(init, name="items")
    optimizer = sok.OptimizerWrapper(keras_optimizer("SGD", 0.5))
    values = tf.constant([1, 10, 2], tf.int64)

    @tf.function
    def step():
        ids = (tf.RaggedTensor.from_tensor(values[:, None]) if one_id
               else tf.RaggedTensor.from_row_lengths(values, [2, 1]))
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(sok.lookup_sparse([table], [ids], combiners=["sum"])[0])
        optimizer.apply_gradients(zip(tape.gradient(loss, [table]), [table]))

    with pytest.raises(tf.errors.InvalidArgumentError,
                       match=r"id 10 of table 'items:0' is out of range \[0, 10\)"):
        on(device, step)
    np.testing.assert_array_equal(table.numpy(), init)


def test_ids_from_a_pipeline_are_checked_on_the_host(device):
    """Ids a tf.data iterator hands over in host memory are checked against their static
    tables there, beside the GPU's lookup, whose outputs wait for the verdict
    (Sok>CheckIdsOnHost with their row splits, copy=False; the GPU then checks nothing,
    neither in the lookup nor in its gradient, so no step waits for or runs a device check):
    good steps train as the same steps with the ids as arguments (checked on the device); a
    step with an id out of range (2^40 too, far outside the table's memory) fails, naming the
    table and the id, and no update lands; a forward alone (an eval step) fails likewise."""
    init = np.arange(40, dtype=np.float32).reshape(10, 4)
    with tf.device(f"{device}:0"):
        tables = [sok.Variable(init, name="piped"), sok.Variable(init, name="argued")]
    optimizers = [sok.OptimizerWrapper(keras_optimizer("SGD", 0.25)) for _ in tables]
    bad_ids = {1: 12, 3: 1 << 40}
    batches = [[1, 7, 1, 3], [2, 12, 5, 0], [9, 9, 0, 4], [3, 1, 1 << 40, 6], [0, 8, 2, 2]]
    rows = tf.RaggedTensor.from_row_lengths(tf.constant(sum(batches, []), tf.int64),
                                            [2, 2] * len(batches))
    dataset = tf.data.Dataset.from_tensor_slices(
        tf.RaggedTensor.from_uniform_row_length(rows, 2)).prefetch(1)
    iterator = iter(dataset)

    def step(table, optimizer, ids):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(sok.lookup_sparse([table], [ids], combiners=["sum"])[0] ** 2)
        optimizer.apply_gradients(zip(tape.gradient(loss, [table]), [table]))

    piped = tf.function(lambda: step(tables[0], optimizers[0], next(iterator)))
    argued = tf.function(lambda ids: step(tables[1], optimizers[1], ids))
    # A forward alone (an eval step): nothing but the lookup's outputs waits for the check.
    eval_iterator = iter(dataset)
    evaluate = tf.function(lambda: sok.lookup_sparse([tables[0]], [next(eval_iterator)],
                                                     combiners=["sum"])[0])
    if device == "GPU":  # (the CPU's lookup checks its ids as it reads them)
        nodes = graph_nodes(piped)
        assert [n.attr["copy"].b for n in nodes if n.op == "Sok>CheckIdsOnHost"] == [False]
        assert [n.attr["host_checked"].b for n in nodes if n.op == "Sok>PoolFromTables"] == [True]
        assert not {"Sok>CheckGatheredIds", "Sok>GuardIds"} & {n.op for n in nodes}
        ids_spec = tf.RaggedTensorSpec([2, None], tf.int64, ragged_rank=1)
        assert any(n.op == "Sok>CheckGatheredIds" for n in graph_nodes(argued, ids_spec))
    for k, batch in enumerate(batches):
        ids = tf.RaggedTensor.from_row_lengths(tf.constant(batch, tf.int64), [2, 2])
        if k in bad_ids:
            before = tables[0].numpy()
            for fn in (evaluate, piped):
                with pytest.raises(tf.errors.InvalidArgumentError,
                                   match=rf"id {bad_ids[k]} of table 'piped:0' is out of "
                                         r"range \[0, 10\)"):
                    on(device, fn)
            np.testing.assert_array_equal(tables[0].numpy(), before)
            continue
        pairs = np.array(batch).reshape(2, 2)
        np.testing.assert_allclose(on(device, evaluate).numpy(),
                                   tables[0].numpy()[pairs].sum(axis=1), rtol=1e-6)
        on(device, piped)
        on(device, argued, ids)
        np.testing.assert_allclose(tables[0].numpy(), tables[1].numpy(), rtol=1e-6)
    assert not np.array_equal(tables[0].numpy(), init)


def test_a_lookup_no_loss_reads_is_not_updated_in_a_step_with_a_bad_id(device):
    """Two tables looked up in one call from a pipeline, the loss reading only the first: the
    second's gradient is zeros over its ids, which must wait for the host's verdict as the
    outputs do. A step with an id out of the second table's range fails and Adam (whose
    moments move a row even for a zero gradient) changes neither table."""
    init = np.arange(40, dtype=np.float32).reshape(10, 4)
    with tf.device(f"{device}:0"):
        tables = [sok.Variable(init, name="read"), sok.Variable(init + 1, name="unread")]
    optimizer = sok.OptimizerWrapper(keras_optimizer("Adam", 0.1))
    batches = [([1, 2, 3, 4], [5, 6, 7, 8]), ([1, 2, 3, 4], [5, 60, 7, 8])]
    features = tuple(tf.RaggedTensor.from_uniform_row_length(
        tf.RaggedTensor.from_row_lengths(tf.constant(sum([b[t] for b in batches], []),
                                                     tf.int64), [2] * 2 * len(batches)), 2)
        for t in range(2))
    iterator = iter(tf.data.Dataset.from_tensor_slices(features))

    def step(read):
        ids = next(iterator)
        with tf.GradientTape() as tape:
            outputs = sok.lookup_sparse(tables, list(ids), combiners=["sum", "sum"])
            loss = tf.add_n([tf.reduce_sum(outputs[t] ** 2) for t in read])
        optimizer.apply_gradients(zip(tape.gradient(loss, tables), tables))

    on(device, tf.function(lambda: step([0, 1])))  # rows 5-8 of both now hold Adam moments
    before = [t.numpy() for t in tables]
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match=r"id 60 of table 'unread:0' is out of range \[0, 10\)"):
        on(device, tf.function(lambda: step([0])))
    for table, want in zip(tables, before):
        np.testing.assert_array_equal(table.numpy(), want)


def test_gradients_of_a_lookup_checked_beside_it_wait_for_the_verdict():
    """The pooled path with a host verdict (taken on a GPU; called directly here): the
    gradient of a table no loss reads (zeros over its ids) waits for Sok>CheckIdsOnHost as
    the outputs do, and holds the ids it was given."""
    from sparse_operation_kit import lookup_inputs, lookup_paths
    tables = [sok.Variable(np.ones([10, 4], np.float32), name=f"beside{t}") for t in range(2)]
    features = tuple(tf.RaggedTensor.from_row_lengths(tf.constant(v, tf.int64), [2, 1])
                     for v in ([1, 2, 3], [4, 5, 6]))
    iterator = iter(tf.data.Dataset.from_tensors(features).repeat())
    seen = {}

    @tf.function
    def step():
        lookups = lookup_inputs.validate_lookups(tables, list(next(iterator)), None,
                                                 ["sum", "sum"])
        with tf.GradientTape() as tape:
            outputs = lookup_paths.pool_from_tables_path(lookups, 4)
            loss = tf.reduce_sum(outputs[0] ** 2)
        unread = tape.gradient(loss, tables)[1]
        seen["indices"], seen["values"] = unread.indices, unread.values
        return unread.indices, unread.values

    indices, values = step()
    np.testing.assert_array_equal(indices.numpy(), [4, 5, 6])
    np.testing.assert_array_equal(values.numpy(), np.zeros([3, 4], np.float32))
    for tensor in seen.values():
        assert "Sok>CheckIdsOnHost" in [c.type for c in tensor.op.control_inputs]


def test_one_id_row_splits_from_a_pipeline_stay_on_the_host(device, monkeypatch):
    """Row splits a tf.data iterator hands over in host memory pass Sok>ElideOneIdRowSplits
    on their way to the pooled lookup (on the CPU the GPU's path is forced): batches where
    every sample holds one id pool without row splits on the device, the others with theirs,
    in one traced step. Outputs and trained tables as tf.nn.safe_embedding_lookup_sparse and
    SGD on plain variables fed the same batches."""
    from sparse_operation_kit import lookup_inputs
    if device == "CPU":
        monkeypatch.setattr(lookup_inputs, "table_on_gpu", lambda table: True)
    rng = np.random.default_rng(17)
    vocabs, dim, batch, combiners = [12, 30], 4, 6, ["mean", "sqrtn"]
    inits = [rng.normal(size=[v, dim]).astype(np.float32) for v in vocabs]
    with tf.device(f"{device}:0"):
        tables = [sok.Variable(i, name=f"elided{t}") for t, i in enumerate(inits)]
        refs = [tf.Variable(i) for i in inits]
    optimizer = sok.OptimizerWrapper(keras_optimizer("SGD", 0.5))
    ref_optimizer = keras_optimizer("SGD", 0.5)
    one = [1] * batch
    lengths = [(one, one), (one, [2, 0, 1, 1, 3, 1]), ([1, 1, 2, 1, 1, 0], one), (one, one)]
    features = [[tf.RaggedTensor.from_row_lengths(
        rng.integers(0, vocabs[t], size=sum(rows)), rows) for t, rows in enumerate(pair)]
        for pair in lengths]
    assert [[len(np.asarray(raw_ops.sok_elide_one_id_row_splits(
        row_splits=[f.row_splits], ids=[f.values])[0])) for f in pair] for pair in features] \
        == [[0, 0], [0, batch + 1], [batch + 1, 0], [0, 0]]
    iterator = iter(tf.data.Dataset.from_tensor_slices(
        tuple(tf.stack(list(column)) for column in zip(*features))))
    cotangents = [tf.constant(rng.normal(size=[batch, dim]).astype(np.float32)) for _ in vocabs]

    def train(lookup, variables, opt, ids):
        with tf.GradientTape() as tape:
            outputs = lookup(variables, ids)
            loss = tf.add_n([tf.reduce_sum(o * c) for o, c in zip(outputs, cotangents)])
        opt.apply_gradients(zip(tape.gradient(loss, variables), variables))
        return outputs

    sok_lookup = lambda variables, ids: sok.lookup_sparse(variables, list(ids), None, combiners)
    ref_lookup = lambda variables, ids: [
        tf.nn.safe_embedding_lookup_sparse(v, i.to_sparse(), None, combiner=c)
        for v, i, c in zip(variables, ids, combiners)]
    piped = tf.function(lambda: train(sok_lookup, tables, optimizer, next(iterator)))
    assert "Sok>ElideOneIdRowSplits" in {n.op for n in graph_nodes(piped)}
    for pair in features:
        got = on(device, piped)
        want = train(ref_lookup, refs, ref_optimizer, pair)
        for g, w in zip(got, want):
            np.testing.assert_allclose(g.numpy(), w.numpy(), rtol=1e-5, atol=1e-6)
        for table, ref in zip(tables, refs):
            np.testing.assert_allclose(table.numpy(), ref.numpy(), rtol=1e-5, atol=1e-6)
    assert not np.allclose(tables[0].numpy(), inits[0])


def test_only_a_few_lookups_ids_are_checked_on_the_host():
    """The host check is taken for a call of up to HOST_CHECK_MAX_LOOKUPS lookups whose ids
    all come from an input pipeline; beyond that, or with ids given as arguments, the ids go
    to the device unchecked (the device checks them)."""
    from sparse_operation_kit import lookup_inputs
    limit = lookup_inputs.HOST_CHECK_MAX_LOOKUPS
    tables = [sok.Variable(np.ones([10, 4], np.float32), name=f"few{t}") for t in range(limit + 1)]
    ids = tf.RaggedTensor.from_row_lengths(tf.constant([1, 2, 3], tf.int64), [2, 1])
    iterator = iter(tf.data.Dataset.from_tensors(ids).repeat())
    checked = {}

    def lookup_of(table, values):
        return lookup_inputs.Lookup(table, values, None, None, "sum", False)

    @tf.function
    def from_pipeline(count):
        batch = next(iterator)
        lookups = [lookup_of(t, batch.values) for t in tables[:count]]
        checked[count] = lookup_inputs.host_verdict(lookups)[0] is not None
        return tf.constant(0)

    @tf.function
    def from_arguments(values):
        checked["arguments"] = lookup_inputs.host_verdict(
            [lookup_of(tables[0], values)])[0] is not None
        return tf.constant(0)

    for count in (1, limit, limit + 1):
        from_pipeline(count)
    from_arguments(ids.values)
    assert checked == {1: True, limit: True, limit + 1: False, "arguments": False}


def test_check_ids_on_host_names_the_first_bad_id():
    """Sok>CheckIdsOnHost against NumPy: in-range ids pass through unchanged (int32 and
    int64, copied); the first id outside [0, rows) in order is
    named with its table, negative ids and ids of 2^40 included; attrs of the wrong length are
    refused."""
    rng = np.random.default_rng(21)
    ids = [rng.integers(0, 1000, size=100_000).astype(np.int64),
           rng.integers(0, 7, size=37).astype(np.int32)]
    for want, rows in zip(ids, [1000, 7]):  # one dtype a call
        got, splits = raw_ops.sok_check_ids_on_host(ids=[want, want[::-1]], row_splits=[],
                                                    rows=[rows, rows], table_names=["a", "b"])
        np.testing.assert_array_equal(got[0].numpy(), want)
        np.testing.assert_array_equal(got[1].numpy(), want[::-1])
        assert got[0].dtype == want.dtype and splits == []
    checked, _ = raw_ops.sok_check_ids_on_host(ids=ids[:1], row_splits=[], rows=[1000],
                                               table_names=["a"], copy=False)
    assert checked[0].shape == [0]  # the check alone
    for bad, copy in itertools.product(([-5], [1000], [1 << 40], [1000, -1]), (True, False)):
        values = ids[0].copy()
        positions = sorted(rng.choice(len(values), size=len(bad), replace=False))
        values[positions] = bad
        first = values[positions[0]]
        with pytest.raises(tf.errors.InvalidArgumentError,
                           match=rf"id {first} of table 'a' is out of range \[0, 1000\)"):
            raw_ops.sok_check_ids_on_host(ids=[values], row_splits=[], rows=[1000],
                                          table_names=["a"], copy=copy)
    with pytest.raises(tf.errors.InvalidArgumentError, match="one entry a lookup"):
        raw_ops.sok_check_ids_on_host(ids=ids[:1] * 2, row_splits=[], rows=[1000],
                                      table_names=["a", "b"])


def test_check_alone_runs_in_a_function_where_only_control_edges_read_it():
    """Sok>CheckIdsOnHost with copy=False gives empty outputs, which lookup_sparse reads only
    through control dependencies: in a tf.function (Grappler's rewrites included) a bad id
    from a pipeline still fails the step, and good ids pass."""
    ids = tf.constant([[1, 2], [3, 99], [4, 5]], tf.int64)
    iterator = iter(tf.data.Dataset.from_tensor_slices(ids))

    @tf.function
    def step():
        batch = next(iterator)
        splits = tf.constant([0, 1, 2], tf.int64)
        with tf.device("CPU:0"):
            checked, checked_splits = raw_ops.sok_check_ids_on_host(
                ids=[batch], row_splits=[splits], rows=[10], table_names=["t"], copy=False)
        with tf.control_dependencies([t.op for t in checked + checked_splits]):
            return tf.identity(tf.reduce_sum(batch))

    assert step().numpy() == 3
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match=r"id 99 of table 't' is out of range \[0, 10\)"):
        step()
    assert step().numpy() == 9


def test_check_ids_on_host_checks_row_splits():
    """Sok>CheckIdsOnHost with row splits: they pass through unchanged beside the ids; splits
    that do not start at 0 and end at the lookup's id count, or that decrease, fail naming
    the lookup, as the CPU's pooled lookup names them; splits for some lookups only are
    refused."""
    rng = np.random.default_rng(22)
    lengths = rng.integers(0, 4, size=500)
    splits = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    values = rng.integers(0, 50, size=splits[-1]).astype(np.int64)
    ones = np.arange(11, dtype=np.int64)
    got, got_splits = raw_ops.sok_check_ids_on_host(
        ids=[values, ones[:10]], row_splits=[splits, ones], rows=[50, 10],
        table_names=["a", "b"])
    _, alone = raw_ops.sok_check_ids_on_host(
        ids=[values, ones[:10]], row_splits=[splits, ones], rows=[50, 10],
        table_names=["a", "b"], copy=False)
    assert [s.shape for s in alone] == [[0], [0]]
    np.testing.assert_array_equal(got[0].numpy(), values)
    np.testing.assert_array_equal(got_splits[0].numpy(), splits)
    np.testing.assert_array_equal(got_splits[1].numpy(), ones)
    wrong_end, decreasing = splits.copy(), splits.copy()
    wrong_end[-1] += 1
    decreasing[7] = decreasing[8] + 1
    for (bad, message), copy in itertools.product(
            ((wrong_end, "lookup 1: row_splits must start at 0 and end at"),
             (decreasing, "lookup 1: row_splits decrease at sample")), (True, False)):
        with pytest.raises(tf.errors.InvalidArgumentError, match=message):
            raw_ops.sok_check_ids_on_host(ids=[ones[:10], values], row_splits=[ones, bad],
                                          rows=[10, 50], table_names=["b", "a"], copy=copy)
    with pytest.raises(tf.errors.InvalidArgumentError, match="none or all of the 2 lookups"):
        raw_ops.sok_check_ids_on_host(ids=[values, values], row_splits=[splits],
                                      rows=[50, 50], table_names=["a", "b"])


def test_one_id_gradients_guarded_on_the_device(device, monkeypatch):
    """The one-id path's gradients as on a GPU, forced on every device: nothing waits for the
    id check (one Sok>CheckGatheredIds, the forward's); a good step trains as Keras' SGD on a
    tf.Variable, and a step with an id out of range fails and writes nothing (its gradient
    ids became -1 on the device)."""
    from sparse_operation_kit import lookup_gradients
    monkeypatch.setattr(lookup_gradients, "_guards_ids_on_device", lambda op: True)
    init = np.arange(40, dtype=np.float32).reshape(10, 4)
    with tf.device(f"{device}:0"):
        table, reference = sok.Variable(init, name="items"), tf.Variable(init)
    optimizer = sok.OptimizerWrapper(keras_optimizer("SGD", 0.5))
    keras_sgd = keras_optimizer("SGD", 0.5)

    def step(values):
        ids = tf.RaggedTensor.from_tensor(values[:, None])
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(sok.lookup_sparse([table], [ids], combiners=["sum"])[0] ** 2)
        optimizer.apply_gradients(zip(tape.gradient(loss, [table]), [table]))

    good = tf.constant([1, 7, 1], tf.int64)
    nodes = graph_nodes(lambda: step(good))
    assert sum(n.op == "Sok>CheckGatheredIds" for n in nodes) == 1
    on(device, tf.function(lambda: step(good)))
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(tf.gather(reference, good) ** 2)
    keras_sgd.apply_gradients([(summed_duplicates(tape.gradient(loss, reference)), reference)])
    np.testing.assert_allclose(table.numpy(), reference.numpy(), rtol=1e-6)
    before = table.numpy()
    # The forward's check names the id; on the CPU the update may refuse the guard's -1 first.
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"id (10|-1) of table 'items:0'"):
        on(device, tf.function(lambda: step(tf.constant([1, 10, 2], tf.int64))))
    np.testing.assert_array_equal(table.numpy(), before)


@pytest.fixture
def deferred_id_check():
    sok.set_id_check("deferred")
    yield
    sok.set_id_check("strict")
    if "GPU" in DEVICES:  # a deferred check of a clean record raises what a test left pending
        with tf.device("GPU:0"):
            try:
                raw_ops.sok_check_gathered_ids(check=tf.constant([-1, 0, 0], tf.int64),
                                               table_names=["t"], deferred=True)
            except tf.errors.InvalidArgumentError:
                pass


def one_id_training(device, name, init, learning_rate):
    """(table, step): a one-id SGD step on sum(rows ** 2) over `table`, in a tf.function."""
    with tf.device(f"{device}:0"):
        table = sok.Variable(init, name=name)
    optimizer = sok.OptimizerWrapper(keras_optimizer("SGD", learning_rate))

    @tf.function
    def step(values):
        ids = tf.RaggedTensor.from_tensor(values[:, None])
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(sok.lookup_sparse([table], [ids], combiners=["sum"])[0] ** 2)
        optimizer.apply_gradients(zip(tape.gradient(loss, [table]), [table]))
        return loss

    return table, step


def sgd_on_squares(table, ids, learning_rate):
    """NumPy's step of step() above: each use of row i adds 2 * row to its gradient."""
    counts = np.bincount(ids, minlength=len(table))[:, None]
    return table - learning_rate * 2 * counts * table


@pytest.mark.skipif("GPU" not in DEVICES, reason="a deferred id check acts on the GPU only")
def test_deferred_id_check_raises_at_a_later_step_and_the_bad_step_updates_nothing(
        deferred_id_check):
    """sok.set_id_check("deferred"): the step with an id out of range returns without waiting
    and updates nothing; a later step raises its error (naming the table, the id and the
    range), applying at most its own update; then training goes on."""
    import time
    init = np.arange(40, dtype=np.float32).reshape(10, 4)
    table, step = one_id_training("GPU", "deferred", init, 0.25)
    good, bad = np.array([1, 7, 1]), np.array([3, 10, 2])
    with tf.device("GPU:0"):
        step(tf.constant(good))
        expected = sgd_on_squares(init, good, 0.25)
        np.testing.assert_allclose(table.numpy(), expected, rtol=1e-6)
        poison("GPU")
        step(tf.constant(bad))  # no error yet: nothing waited for the check
        np.testing.assert_array_equal(table.numpy(), expected)
        time.sleep(0.5)  # the record is read once the stream has passed it
        with pytest.raises(tf.errors.InvalidArgumentError,
                           match=r"id 10 of table 'deferred:0' is out of range \[0, 10\)"):
            step(tf.constant(good)).numpy()
        after = table.numpy()
        if not np.array_equal(after, expected):  # the raising step's own update landed
            expected = sgd_on_squares(expected, good, 0.25)
            np.testing.assert_allclose(after, expected, rtol=1e-6)
        step(tf.constant(good)).numpy()  # the error was raised once; training goes on
        np.testing.assert_allclose(table.numpy(), sgd_on_squares(expected, good, 0.25),
                                   rtol=1e-6)


def test_deferred_id_check_in_a_loop_raises_and_lands_no_update_of_the_bad_step(
        device, deferred_id_check):
    """Ten one-id steps in a tf.range loop (as Keras' steps_per_execution), the fourth with an
    id out of range: its error is raised by the loop (on the CPU at once, on the GPU by a
    later iteration once the record is read) or else by the next step; the rows only the bad
    step reads (4, 5) and rows no step reads (0, 9) keep their values."""
    import time
    init = np.arange(40, dtype=np.float32).reshape(10, 4)
    table, step = one_id_training(device, "looped", init, 0.01)
    batches = tf.constant([[1, 2, 3]] * 3 + [[4, 10, 5]] + [[6, 7, 8]] * 6, tf.int64)

    @tf.function
    def loop():
        for k in tf.range(10):
            step(batches[k])

    poison(device)
    message = r"id 10 of table 'looped:0' is out of range \[0, 10\)"
    with tf.device(f"{device}:0"):
        with pytest.raises(tf.errors.InvalidArgumentError, match=message):
            loop()  # fails here on the CPU
            time.sleep(0.5)  # on the GPU, the loop may end before the record is read
            step(tf.constant([1, 1, 1], tf.int64)).numpy()
        after = table.numpy()
    np.testing.assert_array_equal(after[[0, 4, 5, 9]], init[[0, 4, 5, 9]])
    assert not np.array_equal(after[1:4], init[1:4])  # the good steps before it trained


def test_id_check_modes_are_validated():
    with pytest.raises(ValueError, match=r"unknown id check mode 'lazy'.*'strict', 'deferred'"):
        sok.set_id_check("lazy")


def test_weights_that_do_not_match_ids(device):
    rows = tf.zeros([5, 2])

    def run():
        return raw_ops.sok_combine_forward(rows=rows, position=tf.constant([0, 1, 2], tf.uint32),
                                           row_splits=[tf.constant([0, 2, 3], tf.int64)],
                                           weights=[tf.constant([1.0, 2.0])],
                                           combiners=["sum"])[0].numpy()

    with pytest.raises(tf.errors.InvalidArgumentError,
                       match="weights of lookup 0 have 2 values but its ids have 3"):
        on(device, run)


@pytest.mark.parametrize("splits, message", [
    ([0, 2, 1, 3], "row_splits decrease at sample 1"),
    ([1, 2, 3], "row_splits must start at 0"),
    ([0, 2, 5], "has 5 ids but only 3 positions are left"),
    ([0, 1, 2], "the lookups have 2 ids but position has 3"),
])
def test_bad_row_splits(device, splits, message):
    def run():
        return raw_ops.sok_combine_forward(rows=tf.zeros([5, 2]),
                                           position=tf.constant([0, 1, 2], tf.uint32),
                                           row_splits=[tf.constant(splits, tf.int64)],
                                           weights=[tf.zeros([0])], combiners=["sum"])[0].numpy()

    with pytest.raises(tf.errors.InvalidArgumentError, match=message):
        on(device, run)


def test_row_splits_decreasing_far_into_the_batch_name_their_sample():
    """The CPU scans row splits in blocks: a decrease past the first block is still found and
    named by its sample."""
    splits = np.arange(1001)
    splits[700] = 702  # sample 700 ends before it starts
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match=r"row_splits decrease at sample 700 "):
        on("CPU", lambda: raw_ops.sok_combine_forward(
            rows=tf.zeros([1000, 2]), position=tf.constant(np.arange(1000), tf.uint32),
            row_splits=[tf.constant(splits, tf.int64)], weights=[tf.zeros([0])],
            combiners=["sum"]))


def test_position_out_of_range(device):
    def run():
        return raw_ops.sok_combine_forward(rows=tf.zeros([5, 2]),
                                           position=tf.constant([0, 7, 2], tf.uint32),
                                           row_splits=[tf.constant([0, 2, 3], tf.int64)],
                                           weights=[tf.zeros([0])], combiners=["sum"])[0].numpy()

    with pytest.raises(tf.errors.InvalidArgumentError,
                       match=r"row position 7 is out of range \[0, 5\)"):
        on(device, run)


@pytest.mark.parametrize("weighted", [False, True])
def test_lookup_sparse_skips_the_combine_verdict_only_for_its_own_inputs(weighted):
    """Sok>CombineFromShards / CombineBackward get validate=False only when every input is one
    lookup_sparse built itself (no user weights); the op-level checks stay on otherwise.
    (A CPU table: on a GPU, one worker's static tables pool straight from the tables.)"""
    with tf.device("CPU:0"):
        table = sok.Variable(tf.ones([10, 4]))
    ids = tf.ragged.constant([[1, 2], [3]], dtype=tf.int64)
    weights = tf.ragged.constant([[1.0, 2.0], [3.0]]) if weighted else None

    def step():
        with tf.GradientTape() as tape:
            out = sok.lookup_sparse([table], [ids], None if weights is None else [weights])[0]
            loss = tf.reduce_sum(out)
        return tape.gradient(loss, [table])

    combines = {n.op: n.attr["validate"].b for n in graph_nodes(step)
                if n.op in ("Sok>CombineFromShards", "Sok>CombineBackward")}
    assert combines == {"Sok>CombineFromShards": weighted, "Sok>CombineBackward": weighted}
