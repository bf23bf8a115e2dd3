"""The fused sparse updates of static tables (Sok>StaticApply, and the wrapper's lazy updates
through it) on every device TensorFlow has here, against NumPy, Keras and the CPU kernels;
the device's memory is filled with NaN first, and a refused update writes nothing."""
import numpy as np
import pytest
import tensorflow as tf

import sparse_operation_kit as sok
from sparse_operation_kit import raw_ops
from conftest import DEVICES, graph_nodes, on
from keras_optimizers import keras_2_only


def raw_static_apply(table, indices, grads, table_name, **kwargs):
    """Sok>StaticApply of one table, each index's gradient row given (no grad_rows)."""
    return raw_ops.sok_static_apply(tables=[table], indices=[indices], grads=[grads],
                                    grad_rows=[], grad_scales=[], table_names=[table_name],
                                    **kwargs)


RULES = {  # rule: (hyper, slots)
    "sgd": ([0.1, 0.9], 1),
    "adagrad": ([0.1, 1e-7, 0.0], 1),
    "adam": ([0.01, 0.9, 0.999, 1e-7], 2),
    "adamax": ([0.01, 0.9, 0.999, 1e-7], 2),
    "adadelta": ([1.0, 0.95, 1e-7], 2),
    "rmsprop": ([0.01, 0.9, 0.5, 1e-7, 1.0, 0.0], 3),
    "ftrl": ([0.1, -0.5, 0.01, 0.02, 0.0], 2),
    "nadam": ([0.01, 0.9, 0.999, 1e-7, 0.95, 0.96, 0.9, 0.85, 0.1], 2),
}


def static_apply(device, rule, init, slot_inits, indices, grads):
    hyper, _ = RULES[rule]
    with tf.device(f"{device}:0"):
        table = tf.Variable(init)
        slots = [tf.Variable(s) for s in slot_inits]
    on(device, lambda: raw_static_apply(
        table=table.handle, slots=[s.handle for s in slots], indices=indices, grads=grads,
        hyper=tf.constant(hyper, tf.float32), rule=rule, nesterov=rule == "sgd",
        table_name="t"))
    return table.numpy(), [s.numpy() for s in slots]


@pytest.mark.parametrize("rule", sorted(RULES))
def test_static_apply_equal_on_every_device(rule):
    rng = np.random.default_rng(len(rule))
    rows, dim = 50, 6
    init = rng.normal(size=[rows, dim]).astype(np.float32)
    slot_inits = [rng.uniform(0.1, 1.0, size=[rows, dim]).astype(np.float32)
                  for _ in range(RULES[rule][1])]
    indices = tf.constant(rng.integers(0, rows, size=120), tf.int64)  # duplicates
    grads = tf.constant(rng.normal(size=[120, dim]).astype(np.float32))
    results = [static_apply(device, rule, init, slot_inits, indices, grads) for device in DEVICES]
    touched = np.unique(indices.numpy())
    untouched = np.setdiff1d(np.arange(rows), touched)
    for table, slots in results:
        np.testing.assert_array_equal(table[untouched], init[untouched])
        assert not np.allclose(table[touched], init[touched])
        for slot, slot_init in zip(slots, slot_inits):
            np.testing.assert_array_equal(slot[untouched], slot_init[untouched])
    for table, slots in results[1:]:
        np.testing.assert_allclose(table, results[0][0], rtol=2e-5, atol=2e-6)
        for slot, ref in zip(slots, results[0][1]):
            np.testing.assert_allclose(slot, ref, rtol=2e-5, atol=2e-6)


def grouped_static_apply(device, rule, tables, gathered):
    """One Sok>StaticApply over `tables` [(init, slot inits, ids, grads)] and, for reference,
    one call a table; returns both results. gathered: each table's gradients read through
    grad_rows / grad_scales from a matrix of their own (shuffled rows, scaled)."""
    hyper = tf.constant(RULES[rule][0], tf.float32)
    rng = np.random.default_rng(7)

    def gradient_inputs(ids, grads):
        if not gathered:
            return tf.constant(ids, tf.int64), tf.constant(grads), None
        order = rng.permutation(len(grads))
        scales = rng.uniform(0.5, 2.0, size=len(grads)).astype(np.float32)
        source = np.zeros([len(grads) + 3, grads.shape[1]], np.float32)
        source[order] = grads / scales[:, None]
        return (tf.constant(ids, tf.int64), tf.constant(source),
                (tf.constant(order, tf.int64), tf.constant(scales)))

    inputs = [gradient_inputs(ids, grads) for _, _, ids, grads in tables]

    def apply(members, names):
        with tf.device(f"{device}:0"):
            variables = [(tf.Variable(init), [tf.Variable(s) for s in slots])
                         for init, slots, _, _ in members]
        picked = [inputs[i] for i in names]
        on(device, lambda: raw_ops.sok_static_apply(
            tables=[table.handle for table, _ in variables],
            slots=[slot.handle for _, slots in variables for slot in slots],
            indices=[ids for ids, _, _ in picked], grads=[grads for _, grads, _ in picked],
            grad_rows=[rows for _, _, (rows, _) in picked] if gathered else [],
            grad_scales=[scales for _, _, (_, scales) in picked] if gathered else [],
            hyper=hyper, rule=rule, nesterov=rule == "sgd",
            table_names=[f"t{i}" for i in names]))
        return [(table.numpy(), [slot.numpy() for slot in slots]) for table, slots in variables]

    together = apply(tables, list(range(len(tables))))
    alone = [apply([table], [i])[0] for i, table in enumerate(tables)]
    return together, alone


@pytest.mark.parametrize("gathered", [False, True])
@pytest.mark.parametrize("rule", sorted(RULES))
def test_static_apply_of_a_group_equals_each_table_alone(device, rule, gathered):
    """Tables of different sizes in one Sok>StaticApply (on a GPU: one sort keyed by table and
    row) give each table and slot what an update of that table alone gives: hot ids, a table
    with no ids, a table of one row, ids equal across tables."""
    rng = np.random.default_rng(len(rule) + gathered)
    dim, slots = 8, RULES[rule][1]
    tables = []
    for rows, n in [(7, 300), (1, 5), (500, 0), (3000, 900), (40, 64)]:
        init = rng.normal(size=[rows, dim]).astype(np.float32)
        slot_inits = [rng.uniform(0.1, 1.0, size=[rows, dim]).astype(np.float32)
                      for _ in range(slots)]
        ids = (rng.zipf(1.3, size=n) - 1) % rows
        tables.append((init, slot_inits, ids, rng.normal(size=[n, dim]).astype(np.float32)))
    together, alone = grouped_static_apply(device, rule, tables, gathered)
    for (init, _, ids, _), (table, slot_values), (ref, ref_slots) in zip(tables, together, alone):
        untouched = np.setdiff1d(np.arange(len(init)), ids)
        np.testing.assert_array_equal(table[untouched], init[untouched])
        # A GPU sums a hot id's uses in chunks added atomically: float order may differ.
        np.testing.assert_allclose(table, ref, rtol=1e-4, atol=1e-5)
        for slot, ref_slot in zip(slot_values, ref_slots):
            np.testing.assert_allclose(slot, ref_slot, rtol=1e-4, atol=1e-5)


def test_static_apply_of_a_group_with_a_bad_id_writes_no_table(device):
    """An id outside the second table of a group fails naming that table and id; no table of
    the group (the first one's ids are good) and no slot changes."""
    inits = [np.ones([5, 4], np.float32), 2 * np.ones([9, 4], np.float32)]
    with tf.device(f"{device}:0"):
        tables = [tf.Variable(init) for init in inits]
        slots = [tf.Variable(np.full_like(init, 0.5)) for init in inits for _ in range(2)]
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"id 9 of table 'second'"):
        on(device, lambda: raw_ops.sok_static_apply(
            tables=[t.handle for t in tables], slots=[s.handle for s in slots],
            indices=[tf.constant([0, 4], tf.int64), tf.constant([1, 9, 3], tf.int64)],
            grads=[tf.ones([2, 4]), tf.ones([3, 4])], grad_rows=[], grad_scales=[],
            hyper=tf.constant(RULES["adam"][0]), rule="adam", table_names=["first", "second"]))
    for table, init in zip(tables, inits):
        np.testing.assert_array_equal(table.numpy(), init)
    for slot in slots:
        np.testing.assert_array_equal(slot.numpy(), np.full_like(slot.numpy(), 0.5))


def test_static_apply_refuses_tables_of_different_widths_in_one_call():
    tables = [tf.Variable(np.ones([5, 4], np.float32)), tf.Variable(np.ones([5, 6], np.float32))]
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"table b is 6 wide, the update's "
                                                              r"first table 4"):
        raw_ops.sok_static_apply(
            tables=[t.handle for t in tables], slots=[],
            indices=[tf.constant([0], tf.int64)] * 2, grads=[tf.ones([1, 4]), tf.ones([1, 6])],
            grad_rows=[], grad_scales=[], hyper=tf.constant([0.1, 0.0]), rule="sgd",
            table_names=["a", "b"])
    np.testing.assert_array_equal(tables[0].numpy(), np.ones([5, 4], np.float32))


@pytest.mark.parametrize("repeat", ["table", "slot"])
def test_static_apply_refuses_a_variable_given_twice(device, repeat):
    """One update writes each variable once: a table or slot given twice is refused, naming
    it, and nothing is written."""
    with tf.device(f"{device}:0"):
        tables = [tf.Variable(np.ones([5, 4], np.float32)) for _ in range(2)]
        slots = [tf.Variable(np.full([5, 4], 0.5, np.float32)) for _ in range(2)]
    if repeat == "table":
        table_inputs, slot_inputs, name = [tables[0], tables[1], tables[0]], slots + slots[:1], "c"
    else:
        table_inputs, slot_inputs, name = tables, [slots[0], slots[0]], "b"
    pattern = (f"table {name}" if repeat == "table" else f"optimizer slot 0 of table {name}")
    with pytest.raises(tf.errors.InvalidArgumentError, match=pattern + " is given twice"):
        on(device, lambda: raw_ops.sok_static_apply(
            tables=[t.handle for t in table_inputs], slots=[s.handle for s in slot_inputs],
            indices=[tf.constant([0, 3], tf.int64)] * len(table_inputs),
            grads=[tf.ones([2, 4])] * len(table_inputs), grad_rows=[], grad_scales=[],
            hyper=tf.constant(RULES["adagrad"][0]), rule="adagrad",
            table_names=["a", "b", "c"][:len(table_inputs)]))
    for variable, value in zip(tables + slots, [1.0, 1.0, 0.5, 0.5]):
        np.testing.assert_array_equal(variable.numpy(), np.full([5, 4], value, np.float32))


@pytest.mark.parametrize("rows,dim", [(40, 5), (40, 4), (3, 16), (40, 128), (5000, 132)])
def test_plain_sgd_with_duplicate_ids_matches_numpy(device, rows, dim):
    """SGD without momentum (on a GPU: each use's step added atomically, or, for float4
    rows, each sorted tile's runs summed first) equals NumPy's sum of every use's step, hot
    ids included, over several tiles; a bad id writes nothing."""
    rng = np.random.default_rng(11 + dim)
    n = 3000
    init = rng.normal(size=[rows, dim]).astype(np.float32)
    ids = (rng.zipf(1.3, size=n) - 1) % rows
    grads = rng.normal(size=[n, dim]).astype(np.float32)
    with tf.device(f"{device}:0"):
        table = tf.Variable(init)
    on(device, lambda: raw_static_apply(
        table=table.handle, slots=[], indices=tf.constant(ids, tf.int64),
        grads=tf.constant(grads), hyper=tf.constant([0.1, 0.0]), rule="sgd", table_name="t"))
    expected = init.copy()
    np.add.at(expected, ids, -0.1 * grads)
    np.testing.assert_allclose(table.numpy(), expected, rtol=1e-5, atol=1e-4)
    before = table.numpy()
    with pytest.raises(tf.errors.InvalidArgumentError, match=rf"id {rows} of table 't'"):
        on(device, lambda: raw_static_apply(
            table=table.handle, slots=[], indices=tf.constant([0, rows, 1], tf.int64),
            grads=tf.ones([3, dim]), hyper=tf.constant([0.1, 0.0]), rule="sgd",
            table_name="t"))
    np.testing.assert_array_equal(table.numpy(), before)


@keras_2_only  # Sok>StaticApply: the wrapper's lazy static update, of legacy optimizers only
def test_adam_through_the_wrapper_matches_numpy(device):
    """Legacy Adam on a sok.Variable: Sok>StaticApply, lazy, equal to NumPy's lazy Adam."""
    rng = np.random.default_rng(3)
    init = rng.normal(size=[20, 4]).astype(np.float32)
    with tf.device(f"{device}:0"):
        table = sok.Variable(init)
    optimizer = sok.OptimizerWrapper(tf.keras.optimizers.legacy.Adam(0.1))
    ids = tf.ragged.constant([[1, 3, 3], [], [7]], dtype=tf.int64)

    def step():
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(sok.lookup_sparse([table], [ids], combiners=["sum"])[0])
        optimizer.apply_gradients(zip(tape.gradient(loss, [table]), [table]))

    on(device, step)
    m = np.zeros_like(init)
    v = np.zeros_like(init)
    g = np.zeros_like(init)
    np.add.at(g, [1, 3, 3, 7], 1.0)
    rows = [1, 3, 7]
    m[rows] = 0.1 * g[rows]
    v[rows] = 0.001 * g[rows] ** 2
    lr = 0.1 * np.sqrt(1 - 0.999) / (1 - 0.9)
    expected = init.copy()
    expected[rows] -= lr * m[rows] / (np.sqrt(v[rows]) + 1e-7)
    np.testing.assert_allclose(table.numpy(), expected, rtol=1e-5, atol=1e-6)


def test_static_apply_bad_row_writes_nothing(device):
    init = np.arange(12, dtype=np.float32).reshape(4, 3)
    with tf.device(f"{device}:0"):
        table = tf.Variable(init)
        slot = tf.Variable(np.ones_like(init))
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match=r"id 4 of table 'emb' is out of range \[0, 4\)"):
        on(device, lambda: raw_static_apply(
            table=table.handle, slots=[slot.handle], indices=tf.constant([0, 4, 1], tf.int64),
            grads=tf.ones([3, 3]), hyper=tf.constant([0.1, 0.9]), rule="sgd", table_name="emb"))
    np.testing.assert_array_equal(table.numpy(), init)
    np.testing.assert_array_equal(slot.numpy(), np.ones_like(init))


def test_static_apply_refuses_a_rule_its_slots_cannot_hold(device):
    """A rule whose type needs more state than the slots hold fails on both devices; SGD's
    momentum without its slot (known from the values, which a GPU kernel reads in device
    memory) fails on the CPU and writes nothing on the GPU."""
    init = np.arange(12, dtype=np.float32).reshape(4, 3)
    with tf.device(f"{device}:0"):
        table = tf.Variable(init)
        slot = tf.Variable(np.ones_like(init))
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"adam of table emb needs more"):
        on(device, lambda: raw_static_apply(
            table=table.handle, slots=[slot.handle], indices=tf.constant([0, 1], tf.int64),
            grads=tf.ones([2, 3]), hyper=tf.constant([0.1, 0.9, 0.999, 1e-7]), rule="adam",
            table_name="emb"))

    def momentum_without_slot():
        raw_static_apply(
            table=table.handle, slots=[], indices=tf.constant([0, 1], tf.int64),
            grads=tf.ones([2, 3]), hyper=tf.constant([0.1, 0.9]), rule="sgd", table_name="emb")

    if device == "CPU":
        with pytest.raises(tf.errors.InvalidArgumentError, match=r"sgd of table emb needs more"):
            on(device, momentum_without_slot)
    else:
        on(device, momentum_without_slot)
    np.testing.assert_array_equal(table.numpy(), init)
    np.testing.assert_array_equal(slot.numpy(), np.ones_like(init))


@keras_2_only  # Sok>StaticApply: the wrapper's lazy static update, of legacy optimizers only
@pytest.mark.parametrize("make", [lambda: tf.keras.optimizers.legacy.SGD(0.2),
                                  lambda: tf.keras.optimizers.legacy.Adam(0.2)],
                         ids=["sgd", "adam"])
def test_fused_static_updates_read_hypers_where_the_tables_live(device, make):
    """With static tables only, the wrapper makes a legacy optimizer's hypers and step counter
    on the tables' device and computes the fused update's hyper vector there: on a GPU the
    step stays on the GPU (a host part would make it a two-device function). Values equal
    Keras' on a tf.Variable."""
    rng = np.random.default_rng(9)
    init = rng.normal(size=[20, 4]).astype(np.float32)
    with tf.device(f"{device}:0"):
        table, reference = sok.Variable(init), tf.Variable(init)
    optimizer, keras_optimizer = make(), make()
    wrapper = sok.OptimizerWrapper(optimizer)
    ids = tf.constant([3, 7, 3, 19], tf.int64)

    def step():
        grad = tf.IndexedSlices(tf.ones([4, 4]), ids, dense_shape=tf.constant([20, 4], tf.int64))
        wrapper.apply_gradients([(grad, table)])
        keras_optimizer.apply_gradients([(grad, reference)])

    with tf.device(f"{device}:0"):
        nodes = {n.name: n for n in graph_nodes(step)}
    applies = [n for n in nodes.values() if n.op == "Sok>StaticApply"]
    hyper = [i for i in applies[0].input if not i.startswith("^")][-1].split(":")[0]
    assert len(applies) == 1 and device in nodes[hyper].device, nodes[hyper]
    for _ in range(3):
        on(device, tf.function(step))
    for variable in list(optimizer._hyper.values()) + [wrapper.iterations]:
        if isinstance(variable, tf.Variable):
            assert device in variable.device, (variable.name, variable.device)
    np.testing.assert_allclose(table.numpy(), reference.numpy(), rtol=1e-5, atol=1e-6)
    assert int(wrapper.iterations) == 3


@pytest.mark.parametrize("dim", [3, 4])
def test_static_apply_without_validation_never_writes_outside(device, dim):
    """validate=False (ids lookup_sparse checked): the GPU skips a row outside the table and
    updates the others without waiting for a check (dim 4: float4 rows, sorted tiles); the
    CPU checks anyway."""
    init = np.arange(4 * dim, dtype=np.float32).reshape(4, dim)
    with tf.device(f"{device}:0"):
        table = tf.Variable(init)

    def apply():
        raw_static_apply(
            table=table.handle, slots=[], indices=tf.constant([0, 4, 1, -3], tf.int64),
            grads=tf.ones([4, dim]), hyper=tf.constant([0.5, 0.0]), rule="sgd",
            table_name="emb", validate=False)

    if device == "CPU":
        with pytest.raises(tf.errors.InvalidArgumentError, match=r"id 4 of table 'emb'"):
            on(device, apply)
        np.testing.assert_array_equal(table.numpy(), init)
        return
    on(device, apply)
    expected = init.copy()
    expected[[0, 1]] -= 0.5
    np.testing.assert_array_equal(table.numpy(), expected)


@keras_2_only  # Sok>StaticApply: the wrapper's lazy static update, of legacy optimizers only
@pytest.mark.parametrize("one_id", [False, True])
def test_plain_sgd_wrapper_is_one_fused_update_like_keras(device, one_id):
    """Legacy SGD without momentum through the wrapper: one Sok>StaticApply per table, which
    skips the check of ids lookup_sparse checked (and only of those), equal to Keras' SGD on a
    tf.Variable; a hand-built gradient with an id out of range fails and writes nothing."""
    rng = np.random.default_rng(5)
    init = rng.normal(size=[30, 8]).astype(np.float32)
    values = tf.constant((rng.zipf(1.5, size=64) - 1) % 30, tf.int64)
    ids = (tf.RaggedTensor.from_tensor(values[:, None]) if one_id
           else tf.RaggedTensor.from_row_lengths(values, [2] * 32))
    with tf.device(f"{device}:0"):
        table, reference = sok.Variable(init), tf.Variable(init)
    optimizer = sok.OptimizerWrapper(tf.keras.optimizers.legacy.SGD(0.3))
    keras_sgd = tf.keras.optimizers.legacy.SGD(0.3)

    def step():
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(sok.lookup_sparse([table], [ids], combiners=["sum"])[0] ** 2)
        optimizer.apply_gradients(zip(tape.gradient(loss, [table]), [table]))
        with tf.GradientTape() as tape:
            out = tf.nn.safe_embedding_lookup_sparse(reference, ids.to_sparse(), combiner="sum")
            loss = tf.reduce_sum(out ** 2)
        keras_sgd.apply_gradients(zip(tape.gradient(loss, [reference]), [reference]))

    with tf.device(f"{device}:0"):
        applies = [n for n in graph_nodes(step) if n.op == "Sok>StaticApply"]
    assert [n.attr["validate"].b for n in applies] == [False]
    for _ in range(2):
        on(device, tf.function(step))
    np.testing.assert_allclose(table.numpy(), reference.numpy(), rtol=1e-5, atol=1e-5)

    before = table.numpy()
    bad = tf.IndexedSlices(tf.ones([2, 8]), tf.constant([3, 30], tf.int64))
    with tf.device(f"{device}:0"):
        applies = [n for n in graph_nodes(lambda: optimizer.apply_gradients([(bad, table)]))
                   if n.op == "Sok>StaticApply"]
    assert [n.attr["validate"].b for n in applies] == [True]
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"id 30 of table"):
        on(device, lambda: optimizer.apply_gradients([(bad, table)]))
    np.testing.assert_array_equal(table.numpy(), before)


@keras_2_only  # Sok>StaticApply: the wrapper's lazy static update, of legacy optimizers only
def test_wrapper_updates_the_tables_of_one_width_in_one_call(device):
    """Three tables, two of width 8 and one of width 4, looked up together: the wrapper's
    Adam is two Sok>StaticApply calls (one a width) and equals Keras' Adam on tf.Variables
    (each step touches every row, with duplicates, so lazy and dense Adam agree)."""
    rng = np.random.default_rng(9)
    shapes = [(30, 8), (5, 8), (12, 4)]
    inits = [rng.normal(size=shape).astype(np.float32) for shape in shapes]
    ids = [tf.RaggedTensor.from_row_lengths(tf.constant(rng.permutation(np.concatenate(
        [np.arange(rows), (rng.zipf(1.4, size=40 - rows) - 1) % rows])), tf.int64), [4] * 10)
        for rows, _ in shapes]
    with tf.device(f"{device}:0"):
        tables = [sok.Variable(init) for init in inits]
        references = [tf.Variable(init) for init in inits]
    wrapper = sok.OptimizerWrapper(tf.keras.optimizers.legacy.Adam(0.1))
    keras_adam = tf.keras.optimizers.legacy.Adam(0.1)

    def step():
        with tf.GradientTape() as tape:
            outs = sok.lookup_sparse(tables, ids, combiners=["sum"] * 3)
            loss = sum(tf.reduce_sum(out ** 2) for out in outs)
        wrapper.apply_gradients(zip(tape.gradient(loss, tables), tables))
        with tf.GradientTape() as tape:
            outs = [tf.nn.safe_embedding_lookup_sparse(r, i.to_sparse(), combiner="sum")
                    for r, i in zip(references, ids)]
            loss = sum(tf.reduce_sum(out ** 2) for out in outs)
        keras_adam.apply_gradients(zip(tape.gradient(loss, references), references))

    with tf.device(f"{device}:0"):
        applies = [n for n in graph_nodes(step) if n.op == "Sok>StaticApply"]
    assert sorted(n.attr["num_tables"].i for n in applies) == [1, 2]
    for _ in range(3):
        on(device, tf.function(step))
    for table, reference in zip(tables, references):
        np.testing.assert_allclose(table.numpy(), reference.numpy(), rtol=1e-5, atol=1e-5)


def test_static_apply_refuses_state_the_rule_lacks(device):
    with tf.device(f"{device}:0"):
        table = tf.Variable(tf.zeros([4, 3]))
        slot = tf.Variable(tf.zeros([4, 3]))
    with pytest.raises(tf.errors.InvalidArgumentError):
        on(device, lambda: raw_static_apply(
            table=table.handle, slots=[slot.handle], indices=tf.constant([0], tf.int64),
            grads=tf.ones([1, 3]), hyper=tf.constant([0.1, 0.9, 0.99, 1e-7]), rule="adam",
            table_name="emb"))
