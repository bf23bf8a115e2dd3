"""Pooled lookups straight from the tables (Sok>PoolFromTables, Sok>SpreadPooledGrad): the
path lookup_sparse takes on one worker for static float32 tables on a GPU, list and packed
forms, against tf.nn.safe_embedding_lookup_sparse, NumPy and the fused chain. On the CPU
machine the path is chosen by telling lookup_sparse the tables are on a GPU (the ops have CPU
kernels); on the GPU machine the tables are there."""
import numpy as np
import pytest
import tensorflow as tf

import sparse_operation_kit as sok
from conftest import assert_lookups_match, run_mode
from keras_optimizers import keras_2_only, keras_optimizer
from sparse_operation_kit import lookup, lookup_inputs, raw_ops

ON_GPU = bool(tf.config.list_physical_devices("GPU"))
COMBINERS = ["sum", "mean", "sqrtn"]


@pytest.fixture
def pooled_path(monkeypatch):
    """lookup_sparse takes the pool-from-tables path for static tables."""
    if not ON_GPU:
        monkeypatch.setattr(lookup_inputs, "table_on_gpu", lambda table: True)


def ragged(rng, vocab, batch, max_len=4):
    """(ids, weights) RaggedTensors with empty samples, inner and last."""
    lengths = rng.integers(0, max_len + 1, size=batch)
    lengths[[1, -1]] = 0
    ids = rng.integers(0, vocab, size=lengths.sum()).astype(np.int64)
    weights = rng.uniform(0.5, 2.0, size=lengths.sum()).astype(np.float32)
    return (tf.RaggedTensor.from_row_lengths(ids, lengths),
            tf.RaggedTensor.from_row_lengths(weights, lengths))


def op_types(fn, *args):
    return {op.type for op in tf.function(fn).get_concrete_function(*args).graph.get_operations()}


@pytest.mark.parametrize("mode", ["eager", "function"])
@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("combiner", COMBINERS)
def test_list_form_matches_safe_embedding_lookup_sparse(pooled_path, combiner, weighted, mode):
    rng = np.random.default_rng(COMBINERS.index(combiner) + 3 * weighted)
    vocabs, dim, batch = [30, 9, 50], 8, 13
    inits = [rng.normal(size=[v, dim]).astype(np.float32) for v in vocabs]
    tables, refs = [sok.Variable(i) for i in inits], [tf.Variable(i) for i in inits]
    # Lookup 3 reads table 0 again: its gradient gathers both lookups' ids.
    batches = [ragged(rng, v, batch) for v in vocabs + [vocabs[0]]]
    ids = [b[0] for b in batches]
    weights = [b[1] for b in batches] if weighted else None
    lookup_tables, lookup_refs = tables + [tables[0]], refs + [refs[0]]
    cotangents = [tf.constant(rng.normal(size=[batch, dim]).astype(np.float32)) for _ in ids]

    def step():
        with tf.GradientTape(persistent=True) as tape:
            outs = sok.lookup_sparse(lookup_tables, ids, weights, [combiner] * len(ids))
            refs_out = [tf.nn.safe_embedding_lookup_sparse(
                r, i.to_sparse(), None if weights is None else w.to_sparse(), combiner=combiner)
                for r, i, w in zip(lookup_refs, ids, weights or ids)]
            loss = sum(tf.reduce_sum(o * c) for o, c in zip(outs, cotangents))
            ref_loss = sum(tf.reduce_sum(o * c) for o, c in zip(refs_out, cotangents))
        return outs, refs_out, tape.gradient(loss, tables), tape.gradient(ref_loss, refs)

    assert_lookups_match(*run_mode(mode, step))
    types = op_types(lambda: sok.lookup_sparse(lookup_tables, ids, weights,
                                               [combiner] * len(ids)))
    assert "Sok>PoolFromTables" in types and "Sok>PartitionKeys" not in types


@pytest.mark.parametrize("weighted", [False, True])
def test_packed_form_writes_one_stacked_output(pooled_path, weighted):
    rng = np.random.default_rng(11)
    vocabs, dim, batch = [20, 35, 7, 12], 4, 9
    inits = [rng.normal(size=[v, dim]).astype(np.float32) for v in vocabs]
    tables, refs = [sok.Variable(i) for i in inits], [tf.Variable(i) for i in inits]
    batches = [ragged(rng, v, batch) for v in vocabs]
    row_lengths = tf.concat([b[0].row_lengths() for b in batches], 0)
    packed = tf.RaggedTensor.from_row_lengths(tf.concat([b[0].values for b in batches], 0),
                                              row_lengths)
    packed_w = tf.RaggedTensor.from_row_lengths(tf.concat([b[1].values for b in batches], 0),
                                                row_lengths)
    combiners = ["sum", "mean", "sqrtn", "mean"]
    cotangent = tf.constant(rng.normal(size=[batch, len(vocabs), dim]).astype(np.float32))

    def forward():
        return sok.lookup_sparse(tables, packed, packed_w if weighted else None, combiners)

    with tf.GradientTape(persistent=True) as tape:
        out = forward()
        ref = tf.stack([tf.nn.safe_embedding_lookup_sparse(
            r, i.to_sparse(), w.to_sparse() if weighted else None, combiner=c)
            for r, (i, w), c in zip(refs, batches, combiners)], 1)
        loss, ref_loss = tf.reduce_sum(out * cotangent), tf.reduce_sum(ref * cotangent)
    assert out.shape == (batch, len(vocabs), dim)
    np.testing.assert_allclose(out.numpy(), ref.numpy(), rtol=1e-5, atol=1e-6)
    for grad, ref_grad in zip(tape.gradient(loss, tables), tape.gradient(ref_loss, refs)):
        np.testing.assert_allclose(tf.convert_to_tensor(grad).numpy(),
                                   tf.convert_to_tensor(ref_grad).numpy(), rtol=1e-5, atol=1e-5)
    types = op_types(forward)
    assert "Sok>PoolFromTables" in types and "Pack" not in types  # no tf.stack


@keras_2_only  # Sok>StaticApply sums repeated ids; Keras 3's Adam applies them row by row
def test_trains_like_the_fused_chain(monkeypatch):
    """Adam through OptimizerWrapper: the same tables and slots after several steps whether
    the rows come straight from the tables (repeated ids summed by the update) or through the
    fused chain's dedup."""
    rng = np.random.default_rng(5)
    vocabs, dim, batch = [40, 25], 4, 32
    inits = [rng.normal(size=[v, dim]).astype(np.float32) for v in vocabs]
    direct, fused = [sok.Variable(i) for i in inits], [sok.Variable(i) for i in inits]
    opt_direct = sok.OptimizerWrapper(tf.keras.optimizers.legacy.Adam(0.05))
    opt_fused = sok.OptimizerWrapper(tf.keras.optimizers.legacy.Adam(0.05))
    gpu = {"on": True}
    real_on_gpu = lookup_inputs.table_on_gpu
    monkeypatch.setattr(lookup_inputs, "table_on_gpu",
                        lambda table: gpu["on"] if not ON_GPU else real_on_gpu(table))
    monkeypatch.setattr(lookup, "_pools_from_tables",
                        lambda lookups, dynamic, real=lookup._pools_from_tables:
                        gpu["on"] and real(lookups, dynamic))
    for _ in range(4):
        batches = [ragged(rng, v, batch) for v in vocabs]
        ids, weights = [b[0] for b in batches], [b[1] for b in batches]
        for tables, opt, on in ((direct, opt_direct, True), (fused, opt_fused, False)):
            gpu["on"] = on
            with tf.GradientTape() as tape:
                outs = sok.lookup_sparse(tables, ids, weights, ["sum", "mean"])
                loss = tf.reduce_sum(tf.square(tf.stack(outs, 1)))
            opt.apply_gradients(zip(tape.gradient(loss, tables), tables))
    for a, b in zip(direct, fused):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-5, atol=1e-6)
        for name in ("m", "v"):
            np.testing.assert_allclose(opt_direct.get_slot(a, name).numpy(),
                                       opt_fused.get_slot(b, name).numpy(), rtol=1e-5, atol=1e-6)


def numpy_pool(table, ids, splits, weights, combiner):
    out = np.zeros([len(splits) - 1, table.shape[1]], np.float32)
    for s in range(len(splits) - 1):
        rows = slice(splits[s], splits[s + 1])
        w = np.ones(splits[s + 1] - splits[s], np.float32) if weights is None else weights[rows]
        denominator = {"sum": 1.0, "mean": w.sum(), "sqrtn": np.sqrt((w * w).sum())}[combiner]
        if denominator != 0:
            out[s] = (w[:, None] * table[ids[rows]]).sum(0) / denominator
    return out


@pytest.mark.parametrize("stacked", [False, True])
def test_raw_ops_match_numpy(stacked):
    rng = np.random.default_rng(21)
    dim, batch = 5, 10
    inits = [rng.normal(size=[v, dim]).astype(np.float32) for v in (15, 8)]
    tables = [tf.Variable(i) for i in inits]
    batches = [ragged(rng, len(i), batch) for i in inits]
    weights = [batches[0][1].values, tf.zeros([0])]  # lookup 1 unweighted
    # A sample whose weights sum to zero pools to zeros under mean.
    weights[0] = tf.tensor_scatter_nd_update(weights[0], [[0], [1]], [1.0, -1.0]) \
        if batches[0][0].row_lengths()[0] == 2 else weights[0]
    combiners = ["mean", "sqrtn"]
    outs, check = raw_ops.sok_pool_from_tables(
        tables=[t.handle for t in tables], ids=[b[0].values for b in batches],
        row_splits=[b[0].row_splits for b in batches], weights=weights,
        num_outputs=1 if stacked else 2, stacked=stacked, combiners=combiners, dim=dim,
        table_names=["a", "b"])
    refs = [numpy_pool(i, b[0].values.numpy(), b[0].row_splits.numpy(),
                       w.numpy() if w.shape[0] else None, c)
            for i, b, w, c in zip(inits, batches, weights, combiners)]
    got = [outs[0][:, 0], outs[0][:, 1]] if stacked else outs
    for out, ref in zip(got, refs):
        np.testing.assert_allclose(out.numpy(), ref, rtol=1e-5, atol=1e-6)
    assert check.numpy()[0] == -1  # a clean record: no error

    grads = [rng.normal(size=[batch, dim]).astype(np.float32) for _ in range(2)]
    id_grads = raw_ops.sok_spread_pooled_grad(
        output_grads=[np.stack(grads, 1)] if stacked else grads,
        ids=[b[0].values for b in batches], row_splits=[b[0].row_splits for b in batches],
        weights=weights, stacked=stacked, combiners=combiners, dim=dim)
    for l in range(2):  # each id's row: the pooled gradient's derivative by that row
        splits = batches[l][0].row_splits.numpy()
        w = weights[l].numpy() if weights[l].shape[0] else None
        expected = np.zeros([splits[-1], dim], np.float32)
        for s in range(batch):
            one = np.zeros([len(splits) - 1, dim], np.float32)
            one[s] = grads[l][s]
            for i in range(splits[s], splits[s + 1]):
                ww = np.ones(splits[-1], np.float32) if w is None else w
                rows = slice(splits[s], splits[s + 1])
                d = {"sum": 1.0, "mean": ww[rows].sum(),
                     "sqrtn": np.sqrt((ww[rows] ** 2).sum())}[combiners[l]]
                expected[i] = 0 if d == 0 else ww[i] / d * grads[l][s]
        np.testing.assert_allclose(id_grads[l].numpy(), expected, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("host_checked", [False, True])
def test_lookups_beyond_one_gpu_launch_match_numpy(host_checked):
    """40 lookups (the GPU pools 16 a launch, their descriptors in the kernel's parameters):
    each output, its gradient rows and its shares as NumPy's, the check record clean or, with
    host_checked (ids and row splits checked on the host), empty; a bad id or row splits in
    a later launch's lookup still named by that lookup."""
    rng = np.random.default_rng(40)
    n, dim, batch = 40, 4, 6
    inits = [rng.normal(size=[int(v), dim]).astype(np.float32)
             for v in rng.integers(3, 20, size=n)]
    tables = [tf.Variable(i) for i in inits]
    batches = [ragged(rng, len(i), batch)[0] for i in inits]
    combiners = [COMBINERS[l % 3] for l in range(n)]
    args = dict(row_splits=[b.row_splits for b in batches], weights=[tf.zeros([0])] * n,
                combiners=combiners, dim=dim)
    outs, check = raw_ops.sok_pool_from_tables(
        tables=[t.handle for t in tables], ids=[b.values for b in batches], num_outputs=n,
        table_names=[f"t{l}" for l in range(n)], host_checked=host_checked, **args)
    assert check.shape == ([0] if host_checked else [3])
    if not host_checked:
        assert check.numpy()[0] == -1  # a clean record: no error
    grads = [rng.normal(size=[batch, dim]).astype(np.float32) for _ in range(n)]
    id_grads = raw_ops.sok_spread_pooled_grad(output_grads=grads,
                                              ids=[b.values for b in batches], **args)
    use_rows, use_scales = raw_ops.sok_pooled_grad_shares(
        ids=[b.values for b in batches], num_outputs=n, **args)
    for l, b in enumerate(batches):
        ids, splits = b.values.numpy(), b.row_splits.numpy()
        ref = numpy_pool(inits[l], ids, splits, None, combiners[l])
        np.testing.assert_allclose(outs[l].numpy(), ref, rtol=1e-5, atol=1e-6)
        sample = np.repeat(np.arange(batch), np.diff(splits))
        np.testing.assert_array_equal(use_rows[l].numpy(), sample)
        np.testing.assert_allclose(id_grads[l].numpy(),
                                   use_scales[l].numpy()[:, None] * grads[l][sample],
                                   rtol=1e-5, atol=1e-6)
    if host_checked:
        return
    names = [f"t{l}" for l in range(n)]
    splits = args.pop("row_splits")
    bad_ids = [b.values for b in batches]
    bad_ids[33] = tf.concat([[99], bad_ids[33][1:]], 0)
    bad_splits = list(splits)
    bad_splits[21] = tf.concat([[1], splits[21][1:]], 0)
    for ids, row_splits, message in ((bad_ids, splits, r"id 99 of table 't33'"),
                                     ([b.values for b in batches], bad_splits,
                                      "lookup 21: row_splits must start at 0")):
        with pytest.raises(tf.errors.InvalidArgumentError, match=message):
            _, check = raw_ops.sok_pool_from_tables(  # the CPU fails here, the GPU below
                tables=[t.handle for t in tables], ids=ids, row_splits=row_splits,
                num_outputs=n, table_names=names, **args)
            raw_ops.sok_check_gathered_ids(check, table_names=names)


def test_out_of_range_id_is_refused_and_updates_nothing(pooled_path):
    table = sok.Variable(np.ones([10, 4], np.float32), name="users")
    before = table.numpy()
    opt = sok.OptimizerWrapper(keras_optimizer("SGD", 1.0))
    ids = tf.RaggedTensor.from_row_lengths(tf.constant([1, 12, 3], tf.int64), [2, 1])

    @tf.function
    def step(ids):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(sok.lookup_sparse([table], [ids], combiners=["sum"])[0])
        opt.apply_gradients(zip(tape.gradient(loss, [table]), [table]))

    with pytest.raises(tf.errors.InvalidArgumentError, match=r"id 12 of table 'users"):
        step(ids)
    np.testing.assert_array_equal(table.numpy(), before)


def test_bad_row_splits_weights_and_batches_are_refused():
    table = tf.Variable(tf.ones([10, 4]))
    ids = tf.constant([1, 2, 3], tf.int64)

    def pool(row_splits, weights=None, stacked=False, n=1):
        outs, check = raw_ops.sok_pool_from_tables(
            tables=[table.handle] * n, ids=[ids] * n,
            row_splits=row_splits if n > 1 else [row_splits],
            weights=[tf.zeros([0]) if weights is None else weights] * n,
            num_outputs=1 if stacked else n, stacked=stacked, combiners=["sum"] * n, dim=4,
            table_names=["t"] * n)
        raw_ops.sok_check_gathered_ids(check, table_names=["t"] * n)
        return outs

    with pytest.raises(tf.errors.InvalidArgumentError, match="row_splits must start at 0"):
        pool(tf.constant([0, 1, 2], tf.int64))
    with pytest.raises(tf.errors.InvalidArgumentError, match="row_splits decrease"):
        pool(tf.constant([0, 2, 1, 3], tf.int64))
    with pytest.raises(tf.errors.InvalidArgumentError, match="weights of lookup 0 have 2 values"):
        pool(tf.constant([0, 3], tf.int64), weights=tf.ones([2]))
    with pytest.raises(tf.errors.InvalidArgumentError, match="one batch size"):
        pool([tf.constant([0, 3], tf.int64), tf.constant([0, 1, 3], tf.int64)], stacked=True,
             n=2)


@keras_2_only  # the lazy static update (Sok>StaticApply) is legacy optimizers' only
@pytest.mark.parametrize("stacked", [False, True])
@pytest.mark.parametrize("rule", ["sgd", "adam"])
def test_update_reads_the_pooled_gradient_in_place(pooled_path, monkeypatch, rule, stacked):
    """In a tf.function, OptimizerWrapper's update reads each id's gradient from the pooled
    output's gradient (Sok>PooledGradShares, Sok>StaticApply with grad_rows) instead of
    per-id rows: the same tables and slots as with the rows written, repeated ids, weights,
    all combiners, list and packed forms."""
    from sparse_operation_kit import optimizer as sok_optimizer
    rng = np.random.default_rng(31 + stacked)
    vocabs, dim, batch = [6, 11, 4], 8, 24
    inits = [rng.normal(size=[v, dim]).astype(np.float32) for v in vocabs]
    make = {"sgd": lambda: tf.keras.optimizers.legacy.SGD(0.1),
            "adam": lambda: tf.keras.optimizers.legacy.Adam(0.05)}[rule]
    combiners = ["sum", "mean", "sqrtn"]

    def trainer(tables, opt):
        @tf.function
        def step(ids, weights):
            with tf.GradientTape() as tape:
                if stacked:
                    out = sok.lookup_sparse(tables, ids, weights, combiners)
                else:
                    out = tf.stack(sok.lookup_sparse(tables, ids, weights, combiners), 1)
                loss = tf.reduce_sum(out * tf.range(1.0, dim + 1.0))
            opt.apply_gradients(zip(tape.gradient(loss, tables), tables))
        return step

    in_place = [sok.Variable(i) for i in inits]
    rows = [sok.Variable(i) for i in inits]
    opt_in_place, opt_rows = sok.OptimizerWrapper(make()), sok.OptimizerWrapper(make())
    step_in_place = trainer(in_place, opt_in_place)
    batches = []
    for _ in range(3):
        pairs = [ragged(rng, v, batch) for v in vocabs]
        if stacked:  # feature-major: one RaggedTensor for all tables
            pairs = [tuple(tf.concat([p[k] for p in pairs], 0) for k in range(2))]
            batches.append((pairs[0][0], pairs[0][1]))
        else:
            batches.append(([p[0] for p in pairs], [p[1] for p in pairs]))
    for ids, weights in batches:
        step_in_place(ids, weights)
    graph = step_in_place.get_concrete_function(*batches[0]).graph
    types = {op.type for op in graph.get_operations()}
    assert "Sok>PooledGradShares" in types
    monkeypatch.setattr(sok_optimizer, "pooled_gradient_shares", lambda values: None)
    step_rows = trainer(rows, opt_rows)
    for ids, weights in batches:
        step_rows(ids, weights)
    graph = step_rows.get_concrete_function(*batches[0]).graph
    assert "Sok>PooledGradShares" not in {op.type for op in graph.get_operations()}
    for a, b in zip(in_place, rows):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-5, atol=1e-6)
        for name in ({"sgd": [], "adam": ["m", "v"]}[rule]):
            np.testing.assert_allclose(opt_in_place.get_slot(a, name).numpy(),
                                       opt_rows.get_slot(b, name).numpy(), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("stacked", [False, True])
def test_pooled_grad_shares_and_gathered_update_match_numpy(stacked):
    """Sok>PooledGradShares' rows and scales against NumPy, and Sok>StaticApply reading its
    gradients through them against the update by per-id rows."""
    rng = np.random.default_rng(41)
    dim, batch = 4, 9
    batches = [ragged(rng, v, batch) for v in (7, 5)]
    weights = [batches[0][1].values, tf.zeros([0])]
    combiners = ["mean", "sqrtn"]
    rows, scales = raw_ops.sok_pooled_grad_shares(
        ids=[b[0].values for b in batches], row_splits=[b[0].row_splits for b in batches],
        weights=weights, num_outputs=1 if stacked else 2, stacked=stacked,
        combiners=combiners, dim=dim)
    for l in range(2):
        splits = batches[l][0].row_splits.numpy()
        w = weights[l].numpy() if weights[l].shape[0] else np.ones(splits[-1], np.float32)
        sample = np.repeat(np.arange(batch), np.diff(splits))
        np.testing.assert_array_equal(rows[l].numpy(), sample * 2 + l if stacked else sample)
        for i in range(splits[-1]):
            mine = w[splits[sample[i]]:splits[sample[i] + 1]]
            d = mine.sum() if combiners[l] == "mean" else np.sqrt((mine ** 2).sum())
            np.testing.assert_allclose(scales[l].numpy()[i], w[i] / d, rtol=1e-6)

    grads = rng.normal(size=[batch * 2 if stacked else batch, dim]).astype(np.float32)
    init = rng.normal(size=[7, dim]).astype(np.float32)
    table = tf.Variable(init)
    ids = batches[0][0].values
    raw_ops.sok_static_apply(tables=[table.handle], slots=[], indices=[ids], grads=[grads],
                             grad_rows=[rows[0]], grad_scales=[scales[0]],
                             hyper=tf.constant([0.5, 0.0]), rule="sgd", table_names=["t"])
    expected = init.copy()
    np.add.at(expected, ids.numpy(),
              -0.5 * scales[0].numpy()[:, None] * grads[rows[0].numpy()])
    np.testing.assert_allclose(table.numpy(), expected, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("device", ["CPU"] + (["GPU"] if ON_GPU else []))
def test_gathered_update_with_rows_outside_the_gradient(device):
    """The CPU refuses a gradient row outside grads before writing; the GPU reads it as zeros
    (its rows come from Sok>PooledGradShares)."""
    with tf.device(device):
        table = tf.Variable(tf.ones([5, 2]))

        def apply():
            raw_ops.sok_static_apply(tables=[table.handle], slots=[],
                                     indices=[tf.constant([0, 1], tf.int64)],
                                     grads=[tf.ones([3, 2])],
                                     grad_rows=[tf.constant([0, 3], tf.int64)],
                                     grad_scales=[tf.ones([2])], hyper=tf.constant([0.5, 0.0]),
                                     rule="sgd", table_names=["t"])
        if device == "CPU":
            with pytest.raises(tf.errors.InvalidArgumentError,
                               match=r"grad_rows\[1\] = 3 is outside the 3 rows"):
                apply()
            np.testing.assert_array_equal(table.numpy(), np.ones([5, 2]))
        else:
            apply()
            expected = np.ones([5, 2], np.float32)
            expected[0] -= 0.5
            np.testing.assert_array_equal(table.numpy(), expected)


def one_id_splits_elided(splits, ids):
    """Sok>ElideOneIdRowSplits of one lookup, as NumPy."""
    return np.array(raw_ops.sok_elide_one_id_row_splits(
        row_splits=[tf.constant(splits, tf.int64)], ids=[tf.constant(ids)])[0])


def test_row_splits_elided_only_where_every_sample_holds_one_id():
    np.testing.assert_array_equal(one_id_splits_elided([0, 1, 2, 3], [4, 5, 6]), [])
    np.testing.assert_array_equal(one_id_splits_elided([0], np.zeros([0], np.int32)), [])
    for splits, ids in (([0, 1, 3], [1, 2, 3]),         # a sample of two ids
                        ([0, 0, 1, 2], [1, 2]),         # an empty sample
                        ([0, 1, 2, 3], [1, 2]),         # 0..batch, but fewer ids
                        ([0, 1, 2], [1, 2, 3])):        # 0..batch, but more ids
        np.testing.assert_array_equal(one_id_splits_elided(splits, ids), splits)
    rng = np.random.default_rng(2)
    long = np.arange(70001)
    long[rng.integers(1, 70000)] -= 1  # one miss deep inside a long batch
    np.testing.assert_array_equal(one_id_splits_elided(long, np.zeros(70000, np.int64)), long)
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match=r"row_splits 0 must be a non-empty vector, got \[0\]"):
        one_id_splits_elided(np.zeros([0], np.int64), [1])


@pytest.mark.parametrize("stacked", [False, True])
def test_empty_row_splits_pool_one_id_a_sample(stacked):
    """Sok>PoolFromTables, Sok>SpreadPooledGrad and Sok>PooledGradShares read empty row
    splits as one id a sample: the same outputs, id gradients and shares as the row splits
    0, 1, ..., batch give, and as NumPy (weights and every combiner), on the default device."""
    rng = np.random.default_rng(8 + stacked)
    dim, batch = 6, 11
    inits = [rng.normal(size=[v, dim]).astype(np.float32) for v in (13, 9, 21)]
    tables = [tf.Variable(i) for i in inits]
    ids = [tf.constant(rng.integers(0, len(i), size=batch)) for i in inits]
    weights = [tf.zeros([0]), tf.constant(rng.uniform(-2, 2, size=batch).astype(np.float32)),
               tf.zeros([0])]
    iota = tf.range(batch + 1, dtype=tf.int64)
    n = len(tables)
    args = dict(ids=ids, weights=weights, combiners=COMBINERS, dim=dim, stacked=stacked)
    outputs = dict(num_outputs=1 if stacked else n)
    results = {}
    for form, splits in (("empty", [tf.zeros([0], tf.int64)] * n), ("iota", [iota] * n)):
        outs, _ = raw_ops.sok_pool_from_tables(
            tables=[t.handle for t in tables], row_splits=splits, table_names=["a", "b", "c"],
            **args, **outputs)
        grads = [tf.constant(rng.normal(size=o.shape).astype(np.float32)) for o in outs] \
            if form == "empty" else results["empty"][1]
        id_grads = raw_ops.sok_spread_pooled_grad(output_grads=grads, row_splits=splits, **args)
        shares = raw_ops.sok_pooled_grad_shares(row_splits=splits, **args, **outputs)
        results[form] = (outs, grads, id_grads, shares)
    (outs, grads, id_grads, (use_rows, use_scales)) = results["empty"]
    assert outs[0].shape == ([batch, n, dim] if stacked else [batch, dim])
    for got, want in zip(results["empty"], results["iota"]):
        for a, b in zip(tf.nest.flatten(got), tf.nest.flatten(want)):
            np.testing.assert_array_equal(a.numpy(), b.numpy())
    for l in range(n):
        w = weights[l].numpy() if weights[l].shape[0] else None
        ref = numpy_pool(inits[l], ids[l].numpy(), np.arange(batch + 1), w, COMBINERS[l])
        np.testing.assert_allclose((outs[0][:, l] if stacked else outs[l]).numpy(), ref,
                                   rtol=1e-5, atol=1e-6)
        scale = np.ones(batch, np.float32) if w is None else \
            {"sum": w, "mean": np.ones_like(w), "sqrtn": w / np.abs(w)}[COMBINERS[l]]
        grad = (grads[0][:, l] if stacked else grads[l]).numpy()
        np.testing.assert_allclose(id_grads[l].numpy(), scale[:, None] * grad, rtol=1e-5,
                                   atol=1e-6)
        np.testing.assert_array_equal(use_rows[l].numpy(),
                                      np.arange(batch) * (n if stacked else 1) +
                                      (l if stacked else 0))
        np.testing.assert_allclose(use_scales[l].numpy(), scale, rtol=1e-6)
    traced = tf.function(lambda: raw_ops.sok_pool_from_tables(
        tables=[t.handle for t in tables], row_splits=[tf.zeros([0], tf.int64)] * n,
        table_names=["a", "b", "c"], **args, **outputs)[0]).get_concrete_function()
    assert traced.outputs[0].shape[0] == batch  # the batch read off the ids
