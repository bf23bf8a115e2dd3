"""One Keras optimizer object, wrapped by sok.OptimizerWrapper for a dynamic table and used
as it is for a tf.Variable, as SOK's dynamic-table tests share it: both trained on the same
ids for 100 steps (in a tf.function, then eagerly) end with the same rows.

Each side counts its own steps (the wrapper's `iterations`, the optimizer's `iterations`), as
SOK does, so bias corrections agree. The wrapper's update is lazy: only rows a step touches
move. Legacy Keras optimizers update sparse gradients that way, so they are the reference for
every rule here. New Keras SGD and Adagrad do too; new Keras SGD with momentum, Adamax,
Adadelta and Ftrl move every row of a tf.Variable at every step (momentum and Adamax decay
their state everywhere, Adadelta its accumulators, Ftrl recomputes untouched rows from their
linear term), which a table of keys cannot do: with them the wrapper applies the lazy rule of
the legacy optimizer of the same hyper-parameters (docs/api.md, Optimizers)."""
import numpy as np
import pytest
import tensorflow as tf

import sparse_operation_kit as sok
from keras_optimizers import KERAS_3, keras_2_only, summed_duplicates

DIM, VOCAB, BATCH, STEPS = 8, 2048, 256, 100
OPTIMIZERS = {  # SOK's list in its dynamic-table tests
    "sgd": lambda k: k.SGD(learning_rate=1.0),
    "momentum": lambda k: k.SGD(learning_rate=1.0, momentum=0.9),
    "adamax": lambda k: k.Adamax(learning_rate=1.0, beta_1=0.9, beta_2=0.999),
    "adadelta": lambda k: k.Adadelta(learning_rate=1.0),
    "adagrad": lambda k: k.Adagrad(learning_rate=1.0),
    "ftrl": lambda k: k.Ftrl(learning_rate=1.0),
}
LAZY_IN_NEW_KERAS = {"sgd", "adagrad"}


def step(ids, weights, variable, optimizer, reference=False):
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(tf.nn.embedding_lookup(variable, ids) * weights)
    grad = tape.gradient(loss, variable)
    optimizer.apply_gradients([(summed_duplicates(grad) if reference else grad, variable)])
    return loss


GENERATIONS = [pytest.param("legacy", marks=keras_2_only), "new"]


@pytest.mark.parametrize("name", list(OPTIMIZERS))
@pytest.mark.parametrize("generation", GENERATIONS)
def test_dynamic_table_under_wrapper_equals_tf_variable_under_the_same_optimizer(generation,
                                                                                 name):
    shared = generation == "legacy" or name in LAZY_IN_NEW_KERAS
    if KERAS_3 and not shared:
        pytest.skip("no legacy optimizer to be the lazy reference under Keras 3 "
                    "(tests/optimizers/test_optimizers.py checks these rules against NumPy's)")
    keras = tf.keras.optimizers.legacy if generation == "legacy" else tf.keras.optimizers
    optimizer = OPTIMIZERS[name](keras)
    wrapper = sok.OptimizerWrapper(optimizer)
    table = sok.DynamicVariable(dimension=DIM, var_type="hbm")
    reference = tf.Variable(tf.nn.embedding_lookup(table, np.arange(VOCAB)))
    reference_optimizer = optimizer if shared else OPTIMIZERS[name](tf.keras.optimizers.legacy)
    rng = np.random.default_rng(abs(hash((generation, name))) % 2**32)
    for mode in ("function", "eager"):
        reference_step = tf.function(step) if mode == "function" else step
        for _ in range(STEPS):
            count = int(rng.integers(1, BATCH + 1))
            ids = tf.constant(rng.integers(0, VOCAB, count), tf.int64)
            weights = tf.constant(rng.random((count, DIM)), tf.float32)
            table_loss = step(ids, weights, table, wrapper)
            reference_loss = reference_step(ids, weights, reference, reference_optimizer, True)
            np.testing.assert_allclose(float(table_loss), float(reference_loss), rtol=1e-4,
                                       atol=1e-3)
        rows = tf.nn.embedding_lookup(table, np.arange(VOCAB))
        assert float(tf.reduce_mean((rows - reference) ** 2)) < 1e-6, (mode, name)
    assert int(wrapper.iterations) == 2 * STEPS
    assert int(reference_optimizer.iterations) == 2 * STEPS  # the wrapper's steps not in it


@pytest.mark.parametrize("generation", GENERATIONS)
def test_wrapper_step_count_is_in_a_checkpoint_of_the_optimizer(tmp_path, generation):
    """Adam's bias correction after a restore continues from the restored step count."""
    keras = tf.keras.optimizers.legacy if generation == "legacy" else tf.keras.optimizers
    ids = tf.constant([3, 9, 3, 40], tf.int64)
    weights = tf.constant(np.linspace(-1, 1, 4 * DIM).reshape(4, DIM), tf.float32)

    def run(table, optimizer, steps):
        for _ in range(steps):
            step(ids, weights, table, optimizer)

    straight = sok.DynamicVariable(DIM, initializer="0.5", name=f"adam_straight_{generation}")
    straight_wrapper = sok.OptimizerWrapper(keras.Adam(0.1))
    run(straight, straight_wrapper, 6)

    first = sok.DynamicVariable(DIM, initializer="0.5", name=f"adam_resumed_{generation}")
    first_wrapper = sok.OptimizerWrapper(keras.Adam(0.1))
    run(first, first_wrapper, 3)
    path = tf.train.Checkpoint(table=first, optimizer=first_wrapper.optimizer).save(
        str(tmp_path / "ckpt"))
    resumed = sok.DynamicVariable(DIM, initializer="0.5", name=f"adam_resumed_{generation}")
    resumed_wrapper = sok.OptimizerWrapper(keras.Adam(0.1))
    tf.train.Checkpoint(table=resumed, optimizer=resumed_wrapper.optimizer).restore(path)
    assert int(resumed_wrapper.iterations) == 3
    run(resumed, resumed_wrapper, 3)
    np.testing.assert_allclose(resumed.sparse_read(ids, insert=False).numpy(),
                               straight.sparse_read(ids, insert=False).numpy(), rtol=1e-6)
