"""DynamicVariable as SOK's: a TensorFlow resource variable whose handle is the hash table.
Written as a SOK user's script would use it; references are the table's own rows read back
and NumPy."""
import numpy as np
import pytest
import tensorflow as tf

import sparse_operation_kit as sok
from conftest import subprocess_env
from keras_optimizers import KERAS_3, keras_optimizer

DIM = 4


def rows_of(table, keys):
    return table.sparse_read(tf.constant(keys, tf.int64), insert=False).numpy()


@pytest.mark.parametrize("mode", ["eager", "function"])
def test_size_is_the_table_shape_as_sok_gives_it(mode):
    """SOK's `v.size` is the table's shape, [rows held, dimension] as int32: `v.size[0]` counts
    the rows a SOK script inserted and erased."""
    table = sok.DynamicVariable(DIM, name="size_as_sok")
    size = table.size if mode == "eager" else tf.function(lambda: table.size)()
    assert size.dtype == tf.int32 and size.numpy().tolist() == [0, DIM]
    keys = tf.constant([5, -9, 1 << 33, 5, 7], tf.int64)
    table.sparse_read(keys)  # inserts the 4 distinct keys
    shape = table.size if mode == "eager" else tf.function(lambda: table.size)()
    assert shape.numpy().tolist() == [4, DIM] and int(shape[0]) == len(np.unique(keys.numpy()))
    sok.sparse_read_and_erase(table, tf.constant([5, 7], tf.int64))
    assert table.size.numpy().tolist() == [2, DIM]


@pytest.mark.parametrize("mode", ["eager", "function"])
def test_embedding_lookup_and_gather_read_rows_and_insert_missing_ids(mode):
    table = sok.DynamicVariable(DIM, name="lookup_api")
    ids = tf.constant([[3, -7], [1 << 40, 3]], tf.int64)

    def read():
        return tf.nn.embedding_lookup(table, ids), tf.gather(table, tf.reshape(ids, [-1]))

    looked_up, gathered = read() if mode == "eager" else tf.function(read)()
    assert looked_up.shape == [2, 2, DIM] and gathered.shape == [4, DIM]
    expected = rows_of(table, [3, -7, 1 << 40, 3])  # inserted by the reads above
    np.testing.assert_array_equal(looked_up.numpy().reshape(4, DIM), expected)
    np.testing.assert_array_equal(gathered.numpy(), expected)
    assert table.size.numpy()[0] == 3
    assert np.abs(expected).sum() > 0  # initial rows, not zeros


@pytest.mark.parametrize("mode", ["eager", "function"])
def test_sok_training_loop_trains_a_dynamic_table_through_keras_tracking(mode):
    # SOK's pattern: tables found in model.trainable_variables by sok.filter_variables, the
    # gradient from tf.nn.embedding_lookup, sok.OptimizerWrapper for the tables.
    class Model(tf.keras.Model):
        def __init__(self):
            super().__init__()
            self.table = sok.DynamicVariable(DIM, name="keras_tracked", initializer="uniform")
            self.dense = tf.keras.layers.Dense(1, kernel_initializer="ones")

        def call(self, ids):
            return self.dense(tf.reduce_sum(tf.nn.embedding_lookup(self.table, ids), axis=1))

    model = Model()
    ids = tf.constant([[5, 9], [9, 9]], tf.int64)
    model(ids)
    variables = model.trainable_variables
    if KERAS_3:  # Keras 3 lists only its own variables there (docs/api.md): add the table
        assert not any(v is model.table for v in variables)
        variables = [model.table] + variables
    sok_vars, other_vars = sok.filter_variables(variables)
    assert sok_vars == [model.table] and len(other_vars) == 2
    before = rows_of(model.table, [5, 9])
    table_optimizer = sok.OptimizerWrapper(keras_optimizer("SGD", 0.5))
    dense_optimizer = keras_optimizer("SGD", 0.0)

    def step():
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(model(ids))
        sok_grads, dense_grads = tape.gradient(loss, [sok_vars, other_vars])
        table_optimizer.apply_gradients(zip(sok_grads, sok_vars))
        dense_optimizer.apply_gradients(zip(dense_grads, other_vars))
        return sok_grads[0]

    grad = step() if mode == "eager" else tf.function(step)()
    assert isinstance(grad, tf.IndexedSlices)
    # d loss / d row = (times the id appears) * dense kernel (ones): 5 once, 9 three times.
    np.testing.assert_allclose(rows_of(model.table, [5, 9]),
                               before - 0.5 * np.array([[1.0], [3.0]]), rtol=1e-6)


def test_gradient_is_indexed_slices_keyed_by_id():
    table = sok.DynamicVariable(DIM, name="grad_api")
    ids = tf.constant([11, -2, 11], tf.int64)
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(tf.gather(table, ids) * tf.constant([[1.0], [2.0], [3.0]]))
    grad = tape.gradient(loss, table)
    assert isinstance(grad, tf.IndexedSlices)
    np.testing.assert_array_equal(grad.indices.numpy(), [11, -2, 11])
    np.testing.assert_array_equal(grad.values.numpy(), np.repeat([[1.0], [2.0], [3.0]], DIM, 1))


def test_variable_attributes_as_sok():
    table = sok.DynamicVariable(DIM, name="attrs", trainable=False, constraint=tf.identity)
    assert isinstance(table, tf.Variable)
    assert table.name == "attrs:0" and table.shape.as_list() == [None, DIM]
    assert not table.trainable and table.constraint is tf.identity
    with tf.GradientTape() as tape:  # not trainable: not watched
        loss = tf.reduce_sum(tf.gather(table, tf.constant([1], tf.int64)))
    assert tape.gradient(loss, table) is None
    assert int(table.size[0]) == 1
    other = sok.DynamicVariable(DIM, name="attrs_other")
    assert table != other and table == table and len({table, other}) == 2


def test_a_dense_value_is_an_error_that_says_why():
    table = sok.DynamicVariable(DIM, name="no_dense")
    message = "sok.DynamicVariable 'no_dense' has no dense value"
    with pytest.raises(TypeError, match=message):
        tf.convert_to_tensor(table)
    with pytest.raises(TypeError, match=message):
        table.numpy()
    with pytest.raises(TypeError, match=message):
        table + 1.0
    with pytest.raises(TypeError, match="give keys and their rows"):
        table.assign(np.zeros([3, DIM], np.float32))
    with pytest.raises(TypeError, match="ids of sok.DynamicVariable 'no_dense' must be int32 or "
                                        "int64, got float32"):
        tf.gather(table, tf.constant([1.0]))


def test_checkpoint_round_trip_still_holds_rows(tmp_path):
    table = sok.DynamicVariable(DIM, name="ckpt_api")
    keys = [4, 8, -15]
    table.sparse_read(tf.constant(keys, tf.int64))  # inserts them
    saved = rows_of(table, keys)
    checkpoint = tf.train.Checkpoint(table=table)
    path = checkpoint.write(str(tmp_path / "ckpt"))
    table.assign(tf.constant(keys, tf.int64), np.zeros([3, DIM], np.float32))
    checkpoint.read(path).assert_consumed()
    np.testing.assert_array_equal(rows_of(table, keys), saved)


def test_options_as_sok():
    from sparse_operation_kit import dynamic_variable  # noqa: PLC0415

    assert dynamic_variable.DEFAULT_MAX_CAPACITY == 64 * 1024 * 1024
    # SOK's default: a full table evicts by LRU.
    table = sok.DynamicVariable(2, name="sok_default", max_capacity=4, var_type="hybrid")
    for key in range(10):
        table.sparse_read(tf.constant([key], tf.int64))
    assert int(table.size[0]) == 4
    for name, survivor in [("kLru", 1), ("kLfu", 0)]:
        table = sok.DynamicVariable(2, name=f"names_{name}", max_capacity=2, evict_strategy=name,
                                    var_type="hbm")
        for key in [0, 0, 0, 1, 2]:  # key 0 read most often, key 1 most recently before 2
            table.sparse_read(tf.constant([key], tf.int64))
        np.testing.assert_array_equal(np.sort(sok.export(table)[0].numpy()), sorted([survivor, 2]))
    with pytest.warns(UserWarning, match="kCustomized: sok keeps no user scores; evicting by LRU"):
        sok.DynamicVariable(2, name="customized", evict_strategy="kCustomized")
    with pytest.warns(UserWarning, match=r"options \['max_load_factor'\] do not apply"):
        sok.DynamicVariable(2, name="hinted", max_load_factor=0.5)
    with pytest.raises(ValueError, match="unknown DynamicVariable config \\['capacity'\\]; valid "
                                         "keys are \\('init_capacity'"):
        sok.DynamicVariable(2, capacity=5)
    with pytest.raises(ValueError, match="unknown evict_strategy 'fifo'; valid strategies are "
                                         "'lru' / 'kLru'"):
        sok.DynamicVariable(2, evict_strategy="fifo")


SERVE_SAVED_MODEL = """
import sys, numpy as np, tensorflow as tf
import sparse_operation_kit as sok
sok.init(comm_tool="single")  # loads the op library, which the saved functions use
served = tf.saved_model.load(sys.argv[1])
ids = tf.constant([11, -3, 999, 1 << 45], tf.int64)
np.save(sys.argv[2], served.serve(ids).numpy())
"""


def test_saved_model_with_a_dynamic_table_serves_the_same_rows_in_a_new_process(tmp_path):
    # Beyond SOK: the serving function looks the table up with training=False; tf.saved_model
    # keeps its keys and rows, and a new process serves them (missing keys read zeros).
    import os  # noqa: PLC0415
    import subprocess  # noqa: PLC0415
    import sys  # noqa: PLC0415

    class Ranker(tf.Module):
        def __init__(self):
            super().__init__()
            self.table = sok.DynamicVariable(DIM, name="served_table", dtype=tf.float16)
            self.weights = tf.Variable(tf.ones([DIM, 1]))

        @tf.function(input_signature=[tf.TensorSpec([None], tf.int64)])
        def serve(self, ids):
            rows = sok.lookup_sparse([self.table], [tf.RaggedTensor.from_tensor(ids[:, None])],
                                     training=False)[0]
            return tf.matmul(rows, self.weights)

    ranker = Ranker()
    keys = tf.constant([11, -3, 1 << 45], tf.int64)
    ranker.table.assign(keys, np.arange(3 * DIM, dtype=np.float32).reshape(3, DIM))
    ids = tf.constant([11, -3, 999, 1 << 45], tf.int64)
    expected = ranker.serve(ids).numpy()
    assert expected[2] == 0 and expected[0] != 0 and int(ranker.table.size[0]) == 3
    tf.saved_model.save(ranker, str(tmp_path / "model"))
    result = subprocess.run(
        [sys.executable, "-c", SERVE_SAVED_MODEL, str(tmp_path / "model"), str(tmp_path / "out.npy")],
        env=subprocess_env(), capture_output=True,
        text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    np.testing.assert_array_equal(np.load(tmp_path / "out.npy"), expected)
    loaded = tf.saved_model.load(str(tmp_path / "model"))  # and in this process
    assert isinstance(loaded.table, sok.DynamicVariable) and loaded.table.dtype == tf.float16
    np.testing.assert_array_equal(np.sort(sok.export(loaded.table)[0].numpy()),
                                  np.sort(keys.numpy()))


def test_keras_model_save_and_load_model_keep_a_dynamic_table(tmp_path):
    class Net(tf.keras.Model):
        def __init__(self):
            super().__init__()
            self.table = sok.DynamicVariable(DIM, name="keras_saved")
            self.top = tf.keras.layers.Dense(1)

        def call(self, ids, training=None):
            ragged = tf.RaggedTensor.from_tensor(ids[:, None])
            return self.top(sok.lookup_sparse([self.table], [ragged], training=bool(training))[0])

    model = Net()
    ids = tf.constant([1, 2, 3], tf.int64)
    model(ids, training=True)  # inserts the keys
    expected = model(tf.constant([1, 2, 3, 4], tf.int64), training=False).numpy()
    if KERAS_3:  # no SavedModel format in model.save: the serving export instead
        model.export(str(tmp_path / "net"), input_signature=[tf.TensorSpec([None], tf.int64)])
        served = tf.saved_model.load(str(tmp_path / "net"))
        np.testing.assert_allclose(served.serve(tf.constant([1, 2, 3, 4], tf.int64)).numpy(),
                                   expected, atol=1e-6)
        return
    model.save(str(tmp_path / "net"), save_format="tf")
    loaded = tf.keras.models.load_model(str(tmp_path / "net"))
    np.testing.assert_allclose(loaded(tf.constant([1, 2, 3, 4], tf.int64), training=False).numpy(),
                               expected, atol=1e-6)
    assert int(loaded.table.size[0]) == 3  # key 4 was served as zeros, not inserted
