"""sok.OptimizerWrapper with SOK's surface, and SOK's init(use_legacy_optimizer=True), used as
SOK's scripts use them. References: NumPy (lazy Adagrad) and the table's own state."""
import os
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

import sparse_operation_kit as sok
from conftest import subprocess_env
from keras_optimizers import KERAS_3, keras_2_only, keras_optimizer

DIM = 3


def train_dynamic(optimizer, table, steps, ids):
    wrapper = sok.OptimizerWrapper(optimizer)
    grads = []
    for step in range(steps):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(tf.nn.embedding_lookup(table, ids) ** 2) * (step + 1)
        grad = tape.gradient(loss, table)
        grads.append(tf.convert_to_tensor(tf.math.unsorted_segment_sum(
            grad.values, tf.unique(grad.indices)[1], tf.size(tf.unique(grad.indices)[0]))))
        wrapper.apply_gradients([(grad, table)])
    return wrapper, grads


def test_get_slot_of_a_dynamic_table_is_a_view_of_its_state():
    table = sok.DynamicVariable(DIM, name="slot_view")
    ids = tf.constant([7, -1, 7], tf.int64)
    optimizer = keras_optimizer("Adagrad", 0.1, initial_accumulator_value=0.1)
    wrapper, grads = train_dynamic(optimizer, table, 3, ids)
    unique = np.array([7, -1])
    expected = 0.1 + sum(g.numpy() ** 2 for g in grads)  # lazy Adagrad's accumulator
    accumulator = wrapper.get_slot(table, "accumulator")
    np.testing.assert_allclose(accumulator.sparse_read(unique).numpy(), expected, rtol=1e-5)
    np.testing.assert_array_equal(accumulator.sparse_read([12345]).numpy(), np.zeros([1, DIM]))
    assert accumulator.name == "slot_view/accumulator:0" and "accumulator" in wrapper.get_slot_names()
    assert set(wrapper._slots[table._unique_id]) == {"accumulator"}
    rows = table.sparse_read(tf.constant(unique), insert=False).numpy()
    accumulator.assign(unique, np.full([2, DIM], 4.0, np.float32))
    np.testing.assert_array_equal(accumulator.sparse_read(unique).numpy(), np.full([2, DIM], 4.0))
    np.testing.assert_array_equal(table.sparse_read(tf.constant(unique), insert=False).numpy(), rows)
    with pytest.raises(ValueError, match="the table holds no key 99; nothing written"):
        accumulator.assign([99], np.zeros([1, DIM], np.float32))
    with pytest.raises(KeyError, match="Adagrad keeps no slot 'm' for dynamic table slot_view:0"):
        wrapper.get_slot(table, "m")


def test_lr_global_step_and_name_as_sok():
    table = sok.DynamicVariable(DIM, name="global_step", initializer="zeros")
    wrapper = sok.OptimizerWrapper(keras_optimizer("SGD", 0.5))
    assert float(wrapper.lr) == 0.5
    step = tf.Variable(0, dtype=tf.int64)
    table.sparse_read(tf.constant([3], tf.int64))  # the update reaches keys the table holds
    grad = tf.IndexedSlices(tf.ones([1, DIM]), tf.constant([3], tf.int64))
    wrapper.apply_gradients([(grad, table)], global_step=step, name="sok_step")
    assert int(step) == 1
    np.testing.assert_array_equal(table.sparse_read(tf.constant([3], tf.int64)).numpy(),
                                  np.full([1, DIM], -0.5))


def test_centered_rmsprop_state_is_dumped_and_loaded_with_its_mg_section(tmp_path):
    table = sok.DynamicVariable(DIM, name="centered")
    ids = tf.constant([1, 2, 3], tf.int64)
    optimizer = keras_optimizer("RMSprop", 0.01, centered=True, momentum=0.5)
    wrapper, _ = train_dynamic(optimizer, table, 2, ids)
    assert "mg" in wrapper.get_slot_names()
    saved = {name: wrapper.get_slot(table, name).sparse_read(ids).numpy()
             for name in ["rms", "momentum", "mg"]}
    rows = table.sparse_read(ids, insert=False).numpy()
    assert np.abs(saved["mg"]).sum() > 0
    sok.dump(str(tmp_path), table, [wrapper])  # one variable, a one-element optimizer list
    assert os.path.exists(tmp_path / "centered_0-RMSprop-mg")
    table.assign(ids, np.zeros([3, DIM], np.float32))
    sok.load(str(tmp_path), table, [wrapper])
    np.testing.assert_array_equal(table.sparse_read(ids, insert=False).numpy(), rows)
    for name, state in saved.items():
        np.testing.assert_array_equal(wrapper.get_slot(table, name).sparse_read(ids).numpy(), state)


SOK_EXAMPLE = """
import numpy as np, tensorflow as tf
import sparse_operation_kit as sok
sok.init(comm_tool="single")  # use_legacy_optimizer=True, SOK's default
assert tf.keras.optimizers.Adam is tf.keras.optimizers.legacy.Adam, tf.keras.optimizers.Adam
assert tf.optimizers.SGD is tf.keras.optimizers.legacy.SGD
table = sok.DynamicVariable(4, name="t")
dense = tf.Variable(tf.ones([4, 1]))
optimizer = tf.keras.optimizers.Adam(0.01)
wrapper = sok.OptimizerWrapper(optimizer)
ids = tf.ragged.constant([[1, 2], [3]], tf.int64)
for _ in range(2):  # one optimizer object: sok tables in one call, tf.Variables in another
    with tf.GradientTape() as tape:
        out = sok.lookup_sparse([table], [ids], combiners=["sum"])[0]
        loss = tf.reduce_sum(tf.matmul(out, dense))
    g_table, g_dense = tape.gradient(loss, [table, dense])
    wrapper.apply_gradients([(g_table, table)])
    optimizer.apply_gradients([(g_dense, dense)])
# each side counts its own steps, as in SOK
print("OK", int(optimizer.iterations), int(wrapper.iterations), float(tf.reduce_sum(dense)) != 4.0)
"""


@keras_2_only
def test_use_legacy_optimizer_lets_one_optimizer_update_sok_tables_and_tf_variables():
    env = subprocess_env()
    result = subprocess.run([sys.executable, "-c", SOK_EXAMPLE], env=env, capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "OK 2 2 True" in result.stdout


def reference_rows(make_optimizer, initial, grads):
    """The optimizer applied to a tf.Variable holding the touched rows (every row is touched
    each step, so lazy and dense updates agree)."""
    variable = tf.Variable(initial)
    optimizer = make_optimizer()
    for grad in grads:
        optimizer.apply_gradients([(tf.convert_to_tensor(grad), variable)])
    return variable.numpy(), optimizer, variable


def table_holding(name, keys):
    """A new dynamic table that has inserted `keys`: the table, the keys (int64), their rows."""
    table = sok.DynamicVariable(DIM, name=name)
    keys = tf.constant(keys, tf.int64)
    return table, keys, table.sparse_read(keys).numpy()


def assert_rows_close(table, keys, expected):
    """The rows of `keys` in a table or slot table equal the reference's, within float32
    rounding."""
    np.testing.assert_allclose(table.sparse_read(keys, insert=False).numpy(), expected,
                               rtol=2e-5, atol=1e-6)


GENERIC = {
    "tf1_adam": lambda: tf.compat.v1.train.AdamOptimizer(0.05),
    "tf1_momentum": lambda: tf.compat.v1.train.MomentumOptimizer(0.1, 0.9, use_nesterov=True),
    "adam_amsgrad": lambda: tf.keras.optimizers.legacy.Adam(0.05, amsgrad=True),
    "loss_scale_sgd": lambda: tf.keras.mixed_precision.LossScaleOptimizer(
        tf.keras.optimizers.legacy.SGD(0.1, momentum=0.5), dynamic=False, initial_scale=1.0),
}
if KERAS_3:  # no legacy optimizers; Keras 3's take the path of NEW_KERAS_GENERIC below
    GENERIC = {name: make for name, make in GENERIC.items() if name.startswith("tf1")}


@pytest.mark.parametrize("mode", ["eager", "function"])
@pytest.mark.parametrize("name", sorted(GENERIC))
def test_optimizers_without_a_fused_rule_take_the_generic_path(name, mode):
    table, keys, initial = table_holding(f"generic_{name}_{mode}", [5, -8, 1 << 33])
    wrapper = sok.OptimizerWrapper(GENERIC[name](), generic_rows=8)
    rng = np.random.default_rng(3)
    grads = [rng.normal(size=[3, DIM]).astype(np.float32) for _ in range(4)]

    def step(grad):
        # keys repeated: the generic path sums duplicates first
        indices = tf.concat([keys, keys[:1]], 0)
        values = tf.concat([grad * tf.constant([[1.0], [1.0], [1.0]]), tf.zeros([1, DIM])], 0)
        wrapper.apply_gradients([(tf.IndexedSlices(values, indices), table)])

    run = step if mode == "eager" else tf.function(step)
    for grad in grads:
        run(tf.constant(grad))
    expected, ref_optimizer, ref_variable = reference_rows(GENERIC[name], initial, grads)
    assert_rows_close(table, keys, expected)
    inner = getattr(ref_optimizer, "inner_optimizer", ref_optimizer)
    for slot_name in inner.get_slot_names():
        slot = wrapper.get_slot(table, slot_name)
        assert isinstance(slot, sok.DynamicVariable)
        assert_rows_close(slot, keys, inner.get_slot(ref_variable, slot_name).numpy())


def test_generic_path_refuses_more_touched_rows_than_it_stages():
    table = sok.DynamicVariable(DIM, name="generic_too_many")
    wrapper = sok.OptimizerWrapper(tf.compat.v1.train.AdagradOptimizer(0.1), generic_rows=2)
    grad = tf.IndexedSlices(tf.ones([3, DIM]), tf.constant([1, 2, 3], tf.int64))
    table.sparse_read(tf.constant([1, 2, 3], tf.int64))
    before = table.sparse_read(tf.constant([1, 2, 3], tf.int64), insert=False).numpy()
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match="more touched rows in one step than the generic path's "
                             "generic_rows=2; raise it in OptimizerWrapper"):
        wrapper.apply_gradients([(grad, table)])
    np.testing.assert_array_equal(
        table.sparse_read(tf.constant([1, 2, 3], tf.int64), insert=False).numpy(), before)


def test_generic_path_slots_are_dumped_and_loaded_into_a_new_wrapper(tmp_path):
    table = sok.DynamicVariable(DIM, name="generic_dump")
    keys = tf.constant([2, 4, 6], tf.int64)
    wrapper = sok.OptimizerWrapper(tf.compat.v1.train.AdamOptimizer(0.05), generic_rows=8)
    for step in range(2):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(tf.gather(table, keys) ** 2) * (step + 1)
        wrapper.apply_gradients([(tape.gradient(loss, table), table)])
    rows = table.sparse_read(keys, insert=False).numpy()
    slots = {name: wrapper.get_slot(table, name).sparse_read(keys, insert=False).numpy()
             for name in ["m", "v"]}
    sok.dump(str(tmp_path), [table], wrapper)
    assert os.path.exists(tmp_path / "generic_dump_0-AdamOptimizer-m")
    fresh = sok.OptimizerWrapper(tf.compat.v1.train.AdamOptimizer(0.05), generic_rows=8)
    table.assign(keys, np.zeros([3, DIM], np.float32))
    sok.load(str(tmp_path), [table], fresh)
    np.testing.assert_array_equal(table.sparse_read(keys, insert=False).numpy(), rows)
    for name, expected in slots.items():
        np.testing.assert_array_equal(fresh.get_slot(table, name).sparse_read(
            keys, insert=False).numpy(), expected)


NEW_KERAS_GENERIC = {
    "adamw": lambda: tf.keras.optimizers.AdamW(0.05, weight_decay=0.01),
    "lion": lambda: tf.keras.optimizers.Lion(0.01),
}


@pytest.mark.parametrize("mode", ["eager", "function"])
@pytest.mark.parametrize("name", sorted(NEW_KERAS_GENERIC))
def test_new_keras_optimizers_without_a_fused_rule_take_the_generic_path(name, mode):
    # A new Keras optimizer builds every variable's slots at once: the wrapper builds it at
    # the first step with the tables' staging buffers and that step's tf.Variables, so one
    # optimizer updates both. Reference: the same optimizer on tf.Variables holding the rows.
    table, keys, initial = table_holding(f"new_generic_{name}_{mode}", [7, -3, 1 << 40])
    dense = tf.Variable(np.linspace(-1, 1, 6).astype(np.float32))
    ref_rows, ref_dense = tf.Variable(initial), tf.Variable(dense.numpy())
    wrapper = sok.OptimizerWrapper(NEW_KERAS_GENERIC[name](), generic_rows=8)
    reference = NEW_KERAS_GENERIC[name]()
    rng = np.random.default_rng(4)

    def step(row_grad, dense_grad):
        wrapper.apply_gradients([(tf.IndexedSlices(row_grad, keys), table), (dense_grad, dense)])

    run = step if mode == "eager" else tf.function(step)
    for _ in range(4):
        row_grad = rng.normal(size=[3, DIM]).astype(np.float32)
        dense_grad = rng.normal(size=[6]).astype(np.float32)
        run(tf.constant(row_grad), tf.constant(dense_grad))
        reference.apply_gradients([(tf.constant(row_grad), ref_rows),
                                   (tf.constant(dense_grad), ref_dense)])
    assert_rows_close(table, keys, ref_rows.numpy())
    np.testing.assert_allclose(dense.numpy(), ref_dense.numpy(), rtol=2e-5, atol=1e-6)
    # Keras 2 names a slot "<optimizer>/<slot>/<variable>:0", Keras 3 "<variable>_<slot>"
    ref_slots = {v.name.rsplit("_", 1)[-1] if KERAS_3 else v.name.split(":")[0].split("/")[-2]: v
                 for v in reference.variables if v.shape == ref_rows.shape}
    assert set(wrapper.generic_slot_tables(table)) == set(ref_slots) and ref_slots
    for slot_name, ref_slot in ref_slots.items():
        assert_rows_close(wrapper.get_slot(table, slot_name), keys, ref_slot.numpy())


def test_new_keras_generic_path_refusals_name_the_way_out():
    grad = tf.IndexedSlices(tf.ones([1, DIM]), tf.constant([1], tf.int64))
    table = sok.DynamicVariable(DIM, name="new_generic_late")
    built = tf.keras.optimizers.AdamW(0.01)
    other = tf.Variable(tf.ones([2]))
    built.apply_gradients([(tf.ones([2]), other)])  # built without the table
    with pytest.raises(NotImplementedError, match="cannot add variables later: pass the "
                                                  "tables' gradients in its first"):
        sok.OptimizerWrapper(built).apply_gradients([(grad, table)])
    factored = sok.DynamicVariable(DIM, name="new_generic_factored")
    with pytest.raises(NotImplementedError, match="not one row per table row"):
        sok.OptimizerWrapper(tf.keras.optimizers.Adafactor(0.01)).apply_gradients(
            [(grad, factored)])


def test_generic_path_slots_travel_in_a_tf_train_checkpoint_of_the_table(tmp_path):
    # The slot tables hang off the table in the checkpoint; a new wrapper's slot tables get
    # their rows when it makes them (deferred restoration), so training resumes exactly.
    keys = tf.constant([3, 8, -1], tf.int64)

    def train(table, wrapper, steps):
        for scale in steps:
            with tf.GradientTape() as tape:
                loss = tf.reduce_sum(tf.gather(table, keys) ** 2) * scale
            wrapper.apply_gradients([(tape.gradient(loss, table), table)])

    def momentum():
        return tf.compat.v1.train.MomentumOptimizer(0.1, 0.9)

    saved = sok.DynamicVariable(DIM, name="generic_ckpt_saved")
    saved_wrapper = sok.OptimizerWrapper(momentum(), generic_rows=8)
    train(saved, saved_wrapper, [1.0, 2.0])
    path = tf.train.Checkpoint(table=saved).save(str(tmp_path / "ckpt"))
    restored = sok.DynamicVariable(DIM, name="generic_ckpt_restored")
    restored_wrapper = sok.OptimizerWrapper(momentum(), generic_rows=8)
    tf.train.Checkpoint(table=restored).restore(path)
    fresh = sok.DynamicVariable(DIM, name="generic_ckpt_fresh")  # same rows, no momentum
    fresh.assign(keys, saved.sparse_read(keys, insert=False))
    fresh_wrapper = sok.OptimizerWrapper(momentum(), generic_rows=8)
    for table, wrapper in [(saved, saved_wrapper), (restored, restored_wrapper),
                           (fresh, fresh_wrapper)]:
        train(table, wrapper, [3.0])
    rows = saved.sparse_read(keys, insert=False).numpy()
    np.testing.assert_allclose(restored.sparse_read(keys, insert=False).numpy(), rows,
                               rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(
        restored_wrapper.get_slot(restored, "momentum").sparse_read(keys, insert=False).numpy(),
        saved_wrapper.get_slot(saved, "momentum").sparse_read(keys, insert=False).numpy(),
        rtol=1e-6, atol=1e-7)
    assert not np.allclose(fresh.sparse_read(keys, insert=False).numpy(), rows)
