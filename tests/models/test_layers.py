"""Keras layers over sok tables against references built from tf.keras / tf.nn."""
import os
import subprocess
import sys
import tempfile

import numpy as np
import pytest
import tensorflow as tf

import sparse_operation_kit as sok
from conftest import subprocess_env
from keras_optimizers import keras_optimizer


def weight_tables(layer):
    """The sok tables behind a layer's trainable weights (Keras 3 holds each in a
    TableWeight whose value is the table)."""
    return [getattr(weight, "sok_table", weight) for weight in layer.trainable_weights]


def ragged(rng, batch, vocab, max_len=3):
    lengths = rng.integers(0, max_len + 1, size=batch)
    return tf.RaggedTensor.from_row_lengths(
        tf.constant(rng.integers(0, vocab, size=lengths.sum()), tf.int64), lengths)


@pytest.mark.parametrize("combiner", ["sum", "mean", "sqrtn"])
def test_embedding_pooled_and_unpooled_match_tf(combiner):
    rng = np.random.default_rng(0)
    layer = sok.layers.Embedding(6, input_dim=30, combiner=combiner)
    ids = ragged(rng, 7, 30)
    pooled = layer(ids)
    table = tf.Variable(layer.table.numpy())
    np.testing.assert_allclose(
        pooled.numpy(),
        tf.nn.safe_embedding_lookup_sparse(table, ids.to_sparse(), combiner=combiner).numpy(),
        rtol=1e-5, atol=1e-6)
    dense_ids = tf.constant(rng.integers(0, 30, size=[4, 5]), tf.int64)
    np.testing.assert_allclose(layer(dense_ids).numpy(), tf.gather(table, dense_ids).numpy())
    tables = weight_tables(layer)
    assert len(tables) == 1 and tables[0] is layer.table


def test_dynamic_embedding_reads_its_rows_and_respects_training():
    layer = sok.layers.Embedding(4, dynamic_table=True, combiner="sum", initializer="ones")
    ids = tf.ragged.constant([[1 << 50, 3], [7]], tf.int64)
    np.testing.assert_array_equal(layer(ids).numpy(), [[2] * 4, [1] * 4])
    assert layer.table.size.numpy()[0] == 3
    layer(tf.ragged.constant([[99]], tf.int64), training=False)
    assert layer.table.size.numpy()[0] == 3
    assert layer.sok_dynamic_table is layer.table and layer.trainable_weights == []


def test_distributed_embedding_sok_v1_shapes_and_values():
    layer = sok.layers.DistributedEmbedding("sum", max_vocabulary_size_per_gpu=100,
                                            embedding_vec_size=5, slot_num=3, max_nnz=2,
                                            use_hashtable=False)
    ids = tf.sparse.from_dense(tf.constant([[1, 2], [3, 0], [4, 4], [5, 6], [7, 0], [9, 8]],
                                           tf.int64))  # [batch 2 * slot 3, max_nnz 2]
    out = layer(ids)
    assert out.shape == (2, 3, 5)
    table = layer.table.numpy()
    np.testing.assert_allclose(out.numpy()[0, 0], table[1] + table[2], rtol=1e-6)
    np.testing.assert_allclose(out.numpy()[1, 2], table[9] + table[8], rtol=1e-6)
    hashed = sok.layers.DistributedEmbedding("mean", 100, 5, 3, 2, use_hashtable=True)
    assert hashed(ids).shape == (2, 3, 5) and hashed.table.size.numpy()[0] == 9


def test_sok_v1_layer_names_at_the_top_level():
    """A SOK v1 script's sok.DistributedEmbedding / sok.All2AllDenseEmbedding are the layers."""
    assert sok.DistributedEmbedding is sok.layers.DistributedEmbedding
    assert sok.All2AllDenseEmbedding is sok.layers.All2AllDenseEmbedding
    layer = sok.DistributedEmbedding("sum", 100, 5, slot_num=3, max_nnz=2, use_hashtable=False)
    ids = tf.sparse.from_dense(tf.constant([[1, 2], [3, 0], [4, 4], [5, 6], [7, 0], [9, 8]],
                                           tf.int64))
    out = layer(ids).numpy()
    table = layer.table.numpy()
    np.testing.assert_allclose(out[1, 0], table[5] + table[6], rtol=1e-6)
    assert layer.embedding_variable is layer.table  # v1's attribute name


def test_all2all_dense_embedding_sok_v1_shapes():
    layer = sok.layers.All2AllDenseEmbedding(100, 4, slot_num=3, nnz_per_slot=2)
    ids = tf.constant(np.arange(2 * 3 * 2).reshape(2, 3, 2), tf.int64)
    out = layer(ids)
    assert out.shape == (2, 3, 2, 4)
    rows = layer.table.sparse_read(tf.reshape(ids, [-1]), insert=False).numpy()
    np.testing.assert_array_equal(out.numpy().reshape(-1, 4), rows)
    flat = sok.layers.All2AllDenseEmbedding(100, 4, 3, 2, dynamic_input=True)
    assert flat(tf.constant([1, 2, 3], tf.int64)).shape == (3, 4)


def test_fit_equals_keras_embedding_model():
    """A static sok Embedding trained by model.fit equals tf.keras.layers.Embedding."""
    rng = np.random.default_rng(1)
    x = rng.integers(0, 40, size=[64, 3])
    y = rng.normal(size=[64, 1]).astype(np.float32)

    def build(embedding):
        inputs = tf.keras.Input([3], dtype=tf.int64)
        hidden = tf.keras.layers.Flatten()(embedding(inputs))
        return tf.keras.Model(inputs, tf.keras.layers.Dense(1, kernel_initializer="ones")(hidden))

    sok_layer = sok.layers.Embedding(4, input_dim=40)
    sok_model = build(sok_layer)
    keras_layer = tf.keras.layers.Embedding(40, 4)
    keras_model = build(keras_layer)
    keras_layer.set_weights([sok_layer.table.numpy()])
    for model in (sok_model, keras_model):
        model.compile(keras_optimizer("SGD", 0.1, momentum=0.5), "mse")
        model.fit(x, y, batch_size=16, epochs=2, shuffle=False, verbose=0)
    np.testing.assert_allclose(sok_layer.table.numpy(), keras_layer.get_weights()[0], rtol=1e-5,
                               atol=1e-6)
    np.testing.assert_allclose(sok_model.evaluate(x, y, verbose=0),
                               keras_model.evaluate(x, y, verbose=0), rtol=1e-5)
    np.testing.assert_allclose(sok_model.predict(x, verbose=0), keras_model.predict(x, verbose=0),
                               rtol=1e-5, atol=1e-6)


@pytest.mark.skipif(not sok.layers.KERAS_3, reason="Keras 2 compiles with XLA only when asked")
@pytest.mark.parametrize("jit_compile", ["auto", True])
def test_models_with_sok_layers_are_never_xla_compiled(jit_compile, monkeypatch):
    """Keras 3 compiles fit's step with XLA on a GPU ("auto") unless a layer cannot be: sok's
    ops have no XLA kernels, so a model holding a sok layer (or a sok Model) is not compiled."""
    def model_of(layer, inputs):
        return tf.keras.Model(inputs, tf.keras.layers.Dense(1)(
            tf.keras.layers.Flatten()(layer(inputs))))

    ids, dense = tf.keras.Input([2], dtype=tf.int64), tf.keras.Input([2])
    models = {"static": model_of(sok.layers.Embedding(4, input_dim=40), ids),
              "dynamic": model_of(sok.layers.Embedding(4, dynamic_table=True), ids),
              "sok_model": sok.layers.Model(dense, tf.keras.layers.Dense(1)(dense)),
              "dense_only": tf.keras.Model(dense, tf.keras.layers.Dense(1)(dense))}
    if jit_compile == "auto":  # Keras chooses XLA where it sees a GPU: show it one
        devices = tf.config.list_physical_devices()
        monkeypatch.setattr(tf.config, "list_physical_devices", lambda *kind: devices + [
            tf.config.PhysicalDevice("/physical_device:GPU:0", "GPU")])
    for model in models.values():
        model.compile("sgd", "mse", jit_compile=jit_compile)
    assert {name: bool(model.jit_compile) for name, model in models.items()} == {
        "static": False, "dynamic": False, "sok_model": False, "dense_only": True}


def test_fit_trains_dynamic_tables_like_a_tape_loop():
    rng = np.random.default_rng(2)
    x = rng.integers(-(1 << 40), 1 << 40, size=[48, 2])
    y = rng.normal(size=[48, 1]).astype(np.float32)

    class Net(sok.layers.Model):
        def __init__(self, name):
            super().__init__()
            self.embedding = sok.layers.Embedding(3, dynamic_table=True, name=name)
            self.dense = tf.keras.layers.Dense(1, kernel_initializer="ones")

        def call(self, ids, training=None):
            rows = self.embedding(ids, training=training)
            return self.dense(tf.reshape(rows, [-1, 6]))

    fitted = Net("same_name")
    fitted.compile(keras_optimizer("Adagrad", 0.1), "mse")
    fitted.fit(x, y, batch_size=16, epochs=2, shuffle=False, verbose=0)

    looped = Net("same_name")  # same table name: same initial rows
    looped(tf.constant(x[:1]))
    optimizer = sok.OptimizerWrapper(keras_optimizer("Adagrad", 0.1))
    for _ in range(2):
        for start in range(0, 48, 16):
            with tf.GradientTape() as tape:
                pred = looped(tf.constant(x[start:start + 16]), training=True)
                loss = tf.reduce_mean(tf.square(pred - y[start:start + 16]))
            variables = looped.trainable_variables + [looped.embedding.table]
            optimizer.apply_gradients(zip(tape.gradient(loss, variables), variables))
    keys = tf.constant(x.reshape(-1))
    np.testing.assert_allclose(fitted.embedding.table.sparse_read(keys, insert=False).numpy(),
                               looped.embedding.table.sparse_read(keys, insert=False).numpy(),
                               rtol=1e-5, atol=1e-6)


def test_config_round_trip_and_serialization():
    layers = [sok.layers.Embedding(8, input_dim=10, combiner="sqrtn", mode="distributed"),
              sok.layers.Embedding(8, dynamic_table=True, table_config={"max_capacity": 100}),
              sok.layers.DistributedEmbedding("sum", 10, 4, 3, 2, use_hashtable=False),
              sok.layers.All2AllDenseEmbedding(10, 4, 3, 2)]
    for layer in layers:
        config = layer.get_config()
        clone = type(layer).from_config(config)
        assert clone.get_config() == config
        restored = tf.keras.layers.deserialize(tf.keras.layers.serialize(layer))
        assert type(restored) is type(layer) and restored.get_config() == config


def test_sok_v1_layers_train_in_fit_like_a_tape_loop():
    """DistributedEmbedding (static) and All2AllDenseEmbedding (hash) inside model.fit equal
    the same model trained by a GradientTape loop with OptimizerWrapper."""
    rng = np.random.default_rng(3)
    dense_ids = rng.integers(0, 50, size=[32, 3, 2])
    y = rng.normal(size=[32, 1]).astype(np.float32)

    class Net(sok.layers.Model):
        def __init__(self, name):
            super().__init__()
            self.a2a = sok.layers.All2AllDenseEmbedding(100, 2, slot_num=3, nnz_per_slot=2,
                                                        name=name)
            self.dist = sok.layers.DistributedEmbedding("sum", 100, 2, slot_num=3, max_nnz=2,
                                                        use_hashtable=False, name=name + "_d")
            self.dense = tf.keras.layers.Dense(1, kernel_initializer="ones")

        def call(self, ids, training=None):
            unpooled = tf.reshape(self.a2a(ids, training=training), [-1, 12])
            sparse = tf.sparse.from_dense(tf.reshape(ids + 1, [-1, 2]))  # [batch * slot, nnz]
            pooled = tf.reshape(self.dist(sparse, training=training), [-1, 6])
            return self.dense(tf.concat([unpooled, pooled], axis=1))

    fitted, looped = Net("v1"), Net("v1")
    x = tf.constant(dense_ids, tf.int64)
    fitted(x[:1])
    looped(x[:1])
    looped.dist.table.assign(fitted.dist.table.numpy())
    fitted.compile(keras_optimizer("SGD", 0.1), "mse")
    fitted.fit(x, y, batch_size=8, epochs=1, shuffle=False, verbose=0)
    optimizer = sok.OptimizerWrapper(keras_optimizer("SGD", 0.1))
    for start in range(0, 32, 8):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(looped(x[start:start + 8], training=True) -
                                            y[start:start + 8]))
        variables = looped.trainable_variables + [looped.a2a.table]
        optimizer.apply_gradients(zip(tape.gradient(loss, variables), variables))
    np.testing.assert_allclose(fitted.dist.table.numpy(), looped.dist.table.numpy(), rtol=1e-5,
                               atol=1e-6)
    keys = tf.reshape(x, [-1])
    np.testing.assert_allclose(fitted.a2a.table.sparse_read(keys, insert=False).numpy(),
                               looped.a2a.table.sparse_read(keys, insert=False).numpy(),
                               rtol=1e-5, atol=1e-6)
    assert np.isfinite(fitted.evaluate(x, y, verbose=0))
    assert fitted.predict(x, verbose=0).shape == (32, 1)


def test_functional_model_config_round_trip():
    inputs = tf.keras.Input([3], dtype=tf.int64)
    embedded = sok.layers.Embedding(4, input_dim=20, name="emb")(inputs)
    outputs = tf.keras.layers.Dense(1)(tf.keras.layers.Flatten()(embedded))
    model = tf.keras.Model(inputs, outputs)
    clone = tf.keras.Model.from_config(model.get_config())
    assert isinstance(clone.get_layer("emb"), sok.layers.Embedding)
    assert clone.get_layer("emb").get_config() == model.get_layer("emb").get_config()
    assert clone(tf.constant([[1, 2, 3]], tf.int64)).shape == (1, 1)


def test_functional_sok_model_leaves_the_class_subclassable_and_round_trips():
    """Keras rewrites the bases of a Model subclass called with inputs and outputs; a
    functional sok Model must not do that to sok.layers.Model itself."""
    inputs = tf.keras.Input([3], dtype=tf.int64)
    embedded = sok.layers.Embedding(4, input_dim=20, name="emb")(inputs)
    outputs = tf.keras.layers.Dense(1)(tf.keras.layers.Flatten()(embedded))
    functional = sok.layers.Model(inputs, outputs)
    assert isinstance(functional, sok.layers.Model)
    ids = tf.constant([[1, 2, 3], [4, 5, 6]], tf.int64)

    class Subclassed(sok.layers.Model):
        def __init__(self):
            super().__init__()
            self.emb = sok.layers.Embedding(4, input_dim=20)

        def call(self, x):
            return tf.reduce_sum(self.emb(x), axis=[1, 2])

    assert Subclassed()(ids).shape == (2,)
    clone = sok.layers.Model.from_config(functional.get_config())
    assert isinstance(clone, sok.layers.Model)
    clone.set_weights(functional.get_weights())
    np.testing.assert_allclose(clone(ids).numpy(), functional(ids).numpy(), rtol=1e-6)
    assert Subclassed()(ids).shape == (2,)


def packed(rng, vocabs, batch, max_len=3):
    """(one feature-major packed RaggedTensor, its features as SparseTensors)."""
    features = [ragged(rng, batch, vocab, max_len) for vocab in vocabs]
    return tf.concat(features, 0), [f.to_sparse() for f in features]


def test_packed_embedding_matches_safe_embedding_lookup_sparse():
    """PackedEmbedding of a packed batch and of the same batch staged by sok.stage_features
    equals tf.nn.safe_embedding_lookup_sparse of each of its tables, stacked."""
    rng = np.random.default_rng(7)
    vocabs, combiners = [30, 5, 12], ["sum", "mean", "sqrtn"]
    layer = sok.layers.PackedEmbedding(vocabs, 4, combiner=combiners)
    ids, per_feature = packed(rng, vocabs, 9)
    out = layer(ids)
    assert out.shape == (9, 3, 4)
    assert all(a is b for a, b in zip(weight_tables(layer), layer.tables, strict=True))
    expected = tf.stack([tf.nn.safe_embedding_lookup_sparse(tf.constant(t.numpy()), f, None, c)
                         for t, f, c in zip(layer.tables, per_feature, combiners)], 1)
    np.testing.assert_allclose(out.numpy(), expected.numpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(layer(sok.stage_features(ids, 3)).numpy(), out.numpy())
    config = layer.get_config()
    assert sok.layers.PackedEmbedding.from_config(config).get_config() == config
    with pytest.raises(ValueError, match="2 combiners for 3 features"):
        sok.layers.PackedEmbedding(vocabs, 4, combiner=["sum", "mean"])
    with pytest.raises(ValueError, match="input_dims must list each feature's rows"):
        sok.layers.PackedEmbedding([4, 0], 4)


def test_packed_embedding_trains_in_fit_from_a_staged_pipeline():
    """model.fit over a pipeline that stages its packed batches trains the layer's tables as a
    tape loop of tf.nn.safe_embedding_lookup_sparse over tf.Variables does."""
    rng = np.random.default_rng(8)
    vocabs, batch, steps = [20, 35], 8, 4
    batches = [packed(rng, vocabs, batch) for _ in range(steps)]
    labels = rng.normal(size=[steps, batch, 1]).astype(np.float32)
    layer = sok.layers.PackedEmbedding(vocabs, 3, combiner="sum")
    dense = tf.keras.layers.Dense(1, kernel_initializer="ones", use_bias=False, trainable=False)

    class Packed(sok.layers.Model):  # takes staged batches under Keras 3 too
        def __init__(self):
            super().__init__()
            self.embedding, self.dense = layer, dense

        def call(self, ids):
            return self.dense(tf.reshape(self.embedding(ids), [-1, len(vocabs) * 3]))

    model = Packed()
    model(batches[0][0])
    tables = [tf.Variable(t.numpy()) for t in layer.tables]
    with tf.device("CPU:0"):
        stacked = tf.concat([b[0] for b in batches], 0)
        per_batch = tf.RaggedTensor.from_uniform_row_length(stacked, batch * len(vocabs))
    dataset = tf.data.Dataset.from_tensor_slices((per_batch, labels)).map(
        lambda ids, y: (sok.stage_features(ids, len(vocabs)), y))
    model.compile(keras_optimizer("SGD", 0.1), "mse")
    model.fit(dataset, epochs=1, verbose=0)
    assert len(model.trainable_variables) == len(vocabs)
    optimizer = keras_optimizer("SGD", 0.1)
    for (_, per_feature), y in zip(batches, labels):
        with tf.GradientTape() as tape:
            emb = tf.stack([tf.nn.safe_embedding_lookup_sparse(t, f, None, "sum")
                            for t, f in zip(tables, per_feature)], 1)
            loss = tf.reduce_mean((tf.reduce_sum(emb, [1, 2])[:, None] - y) ** 2)
        optimizer.apply_gradients(zip(tape.gradient(loss, tables), tables))
    for table, reference in zip(layer.tables, tables):
        np.testing.assert_allclose(table.numpy(), reference.numpy(), rtol=1e-5, atol=1e-6)


def trained_functional_model(rng, x):
    """A functional sok Model over a static and a dynamic table, trained by fit with Adam (the
    dynamic table keeps Adam's state next to its rows)."""
    ids = tf.keras.Input([3], dtype="int64")
    static = sok.layers.Embedding(4, input_dim=30, name="static")(ids)
    dynamic = sok.layers.Embedding(4, dynamic_table=True, name="dynamic")(ids + (1 << 40))
    joined = tf.keras.layers.Flatten()(tf.keras.layers.Concatenate()([static, dynamic]))
    model = sok.layers.Model(ids, tf.keras.layers.Dense(1)(joined))
    model.compile(tf.keras.optimizers.Adam(0.01), "mse")
    model.fit(x, rng.normal(size=[len(x), 1]).astype(np.float32), batch_size=16, epochs=2,
              verbose=0)
    return model


def exported_table(table):
    """(keys, rows, optimizer state) of a dynamic table as a checkpoint holds them, by key."""
    saved = table._serialize_to_tensors()
    keys, values, state = (saved[name].numpy() for name in ("keys", "values", "state"))
    order = np.argsort(keys)
    return keys[order], values[order], state[order]


LOAD_IN_NEW_PROCESS = """
import sys
import numpy as np, tensorflow as tf
import sparse_operation_kit as sok
path, x_path, expected_path = sys.argv[1:]
model = tf.keras.models.load_model(path)
saved = np.load(expected_path)
table = model.get_layer("dynamic").table
saved_now = table._serialize_to_tensors()
keys, values, state = (saved_now[n].numpy() for n in ("keys", "values", "state"))
order = np.argsort(keys)
np.testing.assert_array_equal(keys[order], saved["keys"])
np.testing.assert_array_equal(values[order], saved["values"])
np.testing.assert_array_equal(state[order], saved["state"])
np.testing.assert_array_equal(model.get_layer("static").table.numpy(), saved["static"])
np.testing.assert_allclose(model.predict(np.load(x_path), verbose=0), saved["predicted"],
                           rtol=1e-6, atol=1e-7)
print("LOADED")
"""


def test_keras_file_keeps_both_tables_and_the_dynamic_state_in_a_new_process(tmp_path):
    """model.save(".keras") of a model with a static and a dynamic table, loaded by
    keras.models.load_model in a new process: same rows, same Adam state next to the dynamic
    table's rows, same predictions; the SavedModel export serves the same values."""
    rng = np.random.default_rng(11)
    x = rng.integers(0, 30, size=[48, 3])
    model = trained_functional_model(rng, x)
    keys, values, state = exported_table(model.get_layer("dynamic").table)
    assert len(keys) == len(np.unique(x)) and state.shape == (len(keys), 8)  # m and v
    predicted = model.predict(x, verbose=0)
    model.save(str(tmp_path / "model.keras"))
    np.save(tmp_path / "x.npy", x)
    np.savez(tmp_path / "expected.npz", keys=keys, values=values, state=state,
             static=model.get_layer("static").table.numpy(), predicted=predicted)
    result = subprocess.run(
        [sys.executable, "-c", LOAD_IN_NEW_PROCESS, str(tmp_path / "model.keras"),
         str(tmp_path / "x.npy"), str(tmp_path / "expected.npz")],
        capture_output=True, text=True, env=subprocess_env(), timeout=300)
    assert "LOADED" in result.stdout, result.stderr[-3000:]
    model.export(str(tmp_path / "served"))
    served = tf.saved_model.load(str(tmp_path / "served"))
    np.testing.assert_allclose(served.serve(tf.constant(x)).numpy(), predicted, rtol=1e-6,
                               atol=1e-7)


def test_checkpoint_of_a_model_restores_both_tables():
    """tf.train.Checkpoint of a model tracks its sok layers' tables (the dynamic one with its
    optimizer state) and restores them into a new model."""
    rng = np.random.default_rng(12)
    x = rng.integers(0, 30, size=[48, 3])
    model = trained_functional_model(rng, x)
    path = tf.train.Checkpoint(model=model).save(os.path.join(tempfile.mkdtemp(), "ckpt"))
    fresh = trained_functional_model(np.random.default_rng(13), (x[::-1] + 1) % 30)
    tf.train.Checkpoint(model=fresh).restore(path).expect_partial()
    for a, b in zip(exported_table(model.get_layer("dynamic").table),
                    exported_table(fresh.get_layer("dynamic").table)):
        np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(model.get_layer("static").table.numpy(),
                                  fresh.get_layer("static").table.numpy())
    np.testing.assert_allclose(fresh.predict(x, verbose=0), model.predict(x, verbose=0),
                               rtol=1e-6, atol=1e-7)
