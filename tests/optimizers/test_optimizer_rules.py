"""The fused optimizer rules' table (sparse_operation_kit/optimizer_rules.py over
Sok>OptimizerRules, kit_src/core/optimizers/rule_table.h): a step's hyper-parameters packed by
name land in the fields the C++ rule reads by the same names, and the state slots are named
as Keras names them. Every rule's end-to-end agreement with Keras is in test_optimizers.py."""
import numpy as np
import pytest
import tensorflow as tf

import sparse_operation_kit as sok
from sparse_operation_kit import raw_ops
from sparse_operation_kit.optimizer import dynamic_slot_names
from sparse_operation_kit.optimizer_rules import hyper_vector, rule_table, slot_names
from keras_optimizers import keras_optimizer

RULES = ["sgd", "adagrad", "adam", "adamax", "adadelta", "rmsprop", "nadam", "ftrl"]


def test_the_table_holds_every_rule_the_apply_ops_take():
    assert sorted(rule_table()) == sorted(RULES)


@pytest.mark.parametrize("rule", RULES)
def test_apply_takes_exactly_the_hyper_parameters_the_table_names(rule):
    names = rule_table()[rule]["hyper"]
    values = {name: float(i + 1) for i, name in enumerate(names)}
    np.testing.assert_array_equal(hyper_vector(rule, **values).numpy(),
                                  np.arange(1, len(names) + 1, dtype=np.float32))
    table = sok.DynamicVariable(4, name=f"rules_{rule}")
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match=f"{rule} takes {len(names)} hyper-parameters, got {len(names) + 1}"):
        raw_ops.sok_dynamic_apply(table.handle, tf.constant([1], tf.int64), tf.ones([1, 4]),
                                  tf.zeros([len(names) + 1]), rule=rule,
                                  state_dim=4 * len(slot_names(rule)))


def test_hyper_vector_refuses_missing_and_unknown_names():
    with pytest.raises(ValueError, match=r"missing \['beta2', 'epsilon'\], unknown \['beta_2'\]"):
        hyper_vector("adam", lr=0.1, beta1=0.9, beta_2=0.99)
    with pytest.raises(ValueError, match="unknown optimizer rule 'adamw'"):
        hyper_vector("adamw", lr=0.1)


def test_adam_hyper_parameters_reach_the_rule_by_name():
    """Distinct beta1, beta2 and epsilon, packed by name: one Adam step on a dynamic table
    equals NumPy's (a swap of any two would not)."""
    dim = 4
    table = sok.DynamicVariable(dim, name="rules_adam_step", initializer="uniform")
    keys = tf.constant([3, 7], tf.int64)
    before = table.sparse_read(keys).numpy()
    grad = np.array([[0.5, -1.0, 2.0, 0.25], [1.5, 0.1, -0.3, -2.0]], np.float32)
    lr, beta1, beta2, epsilon = 0.1, 0.8, 0.95, 0.3
    raw_ops.sok_dynamic_apply(table.handle, keys, tf.constant(grad),
                              hyper_vector("adam", lr=lr, beta1=beta1, beta2=beta2,
                                           epsilon=epsilon),
                              rule="adam", state_dim=2 * dim)
    m = (1 - beta1) * grad
    v = (1 - beta2) * grad * grad
    want = before - lr * m / (np.sqrt(v) + epsilon)
    np.testing.assert_allclose(table.sparse_read(keys, insert=False).numpy(), want, rtol=1e-5,
                               atol=1e-7)
    exported = raw_ops.sok_dynamic_table_export(table.handle)
    order = np.argsort(exported[0].numpy())
    np.testing.assert_allclose(exported[2].numpy()[order], np.concatenate([m, v], axis=1),
                               rtol=1e-6)


# SOK's (Keras 2's) slot names, under Keras 3 too (whose Adam calls them "momentum", "velocity")
@pytest.mark.parametrize("make, slots", [
    (lambda: keras_optimizer("SGD", 0.1), []),
    (lambda: keras_optimizer("SGD", 0.1, momentum=0.9), ["momentum"]),
    (lambda: keras_optimizer("RMSprop", 0.1), ["rms", "momentum"]),
    (lambda: keras_optimizer("RMSprop", 0.1, centered=True), ["rms", "momentum", "mg"]),
    (lambda: keras_optimizer("Ftrl", 0.1), ["accumulator", "linear"]),
    (lambda: tf.keras.optimizers.Adam(0.1), ["m", "v"]),
    (lambda: tf.keras.optimizers.Adam(0.1, amsgrad=True), []),  # the generic path
])
def test_state_slots_are_the_tables_keras_names(make, slots):
    assert dynamic_slot_names(make()) == slots
