"""OptimizerWrapper on dynamic tables against the same Keras optimizer on a tf.Variable.

The reference applies the optimizer to the touched rows only: TF's own sparse updates for
SGD / momentum / Adagrad are lazy already, so the reference is the Keras optimizer itself on a
tf.Variable; Keras Adam's (and the new Keras SGD-momentum's and RMSprop-without-momentum's)
sparse update also moves untouched rows, so their reference is their formulas applied to the touched rows, in NumPy.
"""
import numpy as np
import pytest
import tensorflow as tf

import sparse_operation_kit as sok

OPTIMIZERS = {
    "legacy_sgd": lambda: tf.keras.optimizers.legacy.SGD(0.1),
    "legacy_momentum": lambda: tf.keras.optimizers.legacy.SGD(0.05, momentum=0.9),
    "legacy_nesterov": lambda: tf.keras.optimizers.legacy.SGD(0.05, momentum=0.8, nesterov=True),
    "legacy_adagrad": lambda: tf.keras.optimizers.legacy.Adagrad(0.1),
    "legacy_adam": lambda: tf.keras.optimizers.legacy.Adam(0.01),
    "legacy_adam_schedule": lambda: tf.keras.optimizers.legacy.Adam(
        tf.keras.optimizers.schedules.ExponentialDecay(0.02, 5, 0.5)),
    "legacy_adamax": lambda: tf.keras.optimizers.legacy.Adamax(0.02),
    "legacy_adadelta": lambda: tf.keras.optimizers.legacy.Adadelta(1.0),
    "legacy_rmsprop": lambda: tf.keras.optimizers.legacy.RMSprop(0.01),
    "legacy_rmsprop_momentum": lambda: tf.keras.optimizers.legacy.RMSprop(0.01, momentum=0.5),
    "legacy_ftrl": lambda: tf.keras.optimizers.legacy.Ftrl(0.1, l1_regularization_strength=0.01,
                                                          l2_regularization_strength=0.02),
    "legacy_ftrl_shrinkage": lambda: tf.keras.optimizers.legacy.Ftrl(
        0.1, learning_rate_power=-0.6, l2_shrinkage_regularization_strength=0.05, beta=0.1),
    "legacy_nadam": lambda: tf.keras.optimizers.legacy.Nadam(0.01),
    "sgd": lambda: tf.keras.optimizers.SGD(0.05, momentum=0.9),
    "adagrad": lambda: tf.keras.optimizers.Adagrad(0.1),
    "adam": lambda: tf.keras.optimizers.Adam(0.01),
}
VOCAB, DIM, STEPS = 25, 4, 20


class LazyMomentum:
    """Keras SGD-with-momentum on touched rows only (the new Keras SGD also moves untouched
    rows by their momentum): m = momentum m - lr g; w += m."""

    def __init__(self, optimizer):
        self.lr, self.momentum, self.m = optimizer.learning_rate.numpy(), optimizer.momentum, {}

    def apply(self, table, rows, grads):
        values = table.numpy()
        for row, grad in zip(rows, grads):
            self.m[row] = self.momentum * self.m.get(row, 0.0) - self.lr * grad
            values[row] += self.m[row]
        table.assign(values)


class LazyRmsprop:
    """Keras RMSprop without momentum on touched rows only (Keras decays every row's mean
    square): ms = rho ms + (1 - rho) g^2; w -= lr g / (sqrt(ms) + eps)."""

    def __init__(self, optimizer):
        self.lr, self.rho, self.epsilon = 0.01, 0.9, optimizer.epsilon
        self.ms = {}

    def apply(self, table, rows, grads):
        values = table.numpy()
        for row, grad in zip(rows, grads):
            self.ms[row] = self.rho * self.ms.get(row, 0.0) + (1 - self.rho) * grad * grad
            values[row] -= self.lr * grad / (np.sqrt(self.ms[row]) + self.epsilon)
        table.assign(values)


class LazyNadam:
    """Keras legacy Nadam on touched rows only (Keras decays every row's moments): its
    momentum schedule m_t = b1 (1 - 0.5 * 0.96^(decay t)) and running product, then
    w -= lr ((1 - m_t) g / (1 - prod_t) + m_t+1 m / (1 - prod_t+1)) / (sqrt(v / (1 - b2^t)) + eps)."""

    def __init__(self, optimizer):
        self.lr, self.beta1, self.beta2 = 0.01, 0.9, 0.999
        self.epsilon, self.decay = optimizer.epsilon, float(optimizer._initial_decay)
        self.step, self.product, self.m, self.v = 0, 1.0, {}, {}

    def apply(self, table, rows, grads):
        self.step += 1
        t = self.step
        now = self.beta1 * (1 - 0.5 * 0.96 ** (self.decay * t))
        following = self.beta1 * (1 - 0.5 * 0.96 ** (self.decay * (t + 1)))
        self.product *= now
        product_next = self.product * following
        values = table.numpy()
        for row, grad in zip(rows, grads):
            m = self.beta1 * self.m.get(row, 0.0) + (1 - self.beta1) * grad
            v = self.beta2 * self.v.get(row, 0.0) + (1 - self.beta2) * grad * grad
            self.m[row], self.v[row] = m, v
            m_bar = (1 - now) * grad / (1 - self.product) + following * m / (1 - product_next)
            values[row] -= self.lr * m_bar / (np.sqrt(v / (1 - self.beta2 ** t)) + self.epsilon)
        table.assign(values)


class LazyAdam:
    """Keras Adam's formulas (legacy and new agree) applied to the touched rows only, in NumPy:
    lr_t = lr(t-1) * sqrt(1 - b2^t) / (1 - b1^t); m = b1 m + (1 - b1) g; v = b2 v + (1 - b2) g^2;
    w -= lr_t m / (sqrt(v) + eps)."""

    def __init__(self, optimizer):
        self.lr = optimizer.learning_rate if not hasattr(optimizer, "_get_hyper") else \
            optimizer._get_hyper("learning_rate")
        self.beta1, self.beta2, self.epsilon = 0.9, 0.999, optimizer.epsilon
        self.step, self.m, self.v = 0, {}, {}

    def apply(self, table, rows, grads):
        rate = self.lr(self.step) if callable(self.lr) else self.lr
        self.step += 1
        t = self.step
        lr_t = float(rate) * np.sqrt(1 - self.beta2 ** t) / (1 - self.beta1 ** t)
        values = table.numpy()
        for row, grad in zip(rows, grads):
            m = self.beta1 * self.m.get(row, 0.0) + (1 - self.beta1) * grad
            v = self.beta2 * self.v.get(row, 0.0) + (1 - self.beta2) * grad * grad
            self.m[row], self.v[row] = m, v
            values[row] -= lr_t * m / (np.sqrt(v) + self.epsilon)
        table.assign(values)


def touched_rows_reference(table, optimizer, ids):
    """One step of `optimizer` on the rows `ids` touch (a tf.Variable over the key universe)."""
    with tf.GradientTape() as tape:
        out = tf.reduce_sum(tf.gather(table, ids), axis=1)
        loss = tf.reduce_sum(out * out)
    grad = tape.gradient(loss, table)
    if isinstance(optimizer, (LazyAdam, LazyMomentum, LazyRmsprop, LazyNadam)):
        dense = tf.convert_to_tensor(grad).numpy().astype(np.float64)
        rows = np.unique(ids.values.numpy())
        optimizer.apply(table, rows, dense[rows])
    else:
        optimizer.apply_gradients([(grad, table)])


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
@pytest.mark.parametrize("mode", ["eager", "function"])
def test_matches_keras_optimizer_on_touched_rows(name, mode):
    rng = np.random.default_rng(9)
    universe = rng.integers(-(1 << 62), 1 << 62, size=VOCAB)
    table = sok.DynamicVariable(DIM, name=f"opt_{name}_{mode}")
    initial = table.sparse_read(tf.constant(universe)).numpy()   # every key, initial rows
    reference = tf.Variable(initial)
    wrapper = sok.OptimizerWrapper(OPTIMIZERS[name]())
    ref_optimizer = OPTIMIZERS[name]()
    if name in ("legacy_adam", "legacy_adam_schedule", "adam"):
        ref_optimizer = LazyAdam(ref_optimizer)
    elif name == "sgd":
        ref_optimizer = LazyMomentum(ref_optimizer)
    elif name == "legacy_rmsprop":
        ref_optimizer = LazyRmsprop(ref_optimizer)
    elif name == "legacy_nadam":
        ref_optimizer = LazyNadam(ref_optimizer)

    def sok_step(ids):
        with tf.GradientTape() as tape:
            out = sok.lookup_sparse([table], [ids], combiners=["sum"])[0]
            loss = tf.reduce_sum(out * out)
        wrapper.apply_gradients([(tape.gradient(loss, table), table)])

    if mode == "function":
        sok_step = tf.function(sok_step, reduce_retracing=True)
    for _ in range(STEPS):
        lengths = rng.integers(0, 4, size=6)
        rows = rng.integers(0, VOCAB, size=lengths.sum())
        sok_step(tf.RaggedTensor.from_row_lengths(tf.constant(universe[rows]), lengths))
        touched_rows_reference(reference, ref_optimizer,
                               tf.RaggedTensor.from_row_lengths(tf.constant(rows, tf.int64), lengths))
    np.testing.assert_allclose(table.sparse_read(tf.constant(universe), insert=False).numpy(),
                               reference.numpy(), rtol=1e-5, atol=1e-6)


def test_static_variables_go_to_the_wrapped_optimizer():
    table = sok.Variable(np.ones([5, 2], np.float32))
    wrapper = sok.OptimizerWrapper(tf.keras.optimizers.legacy.SGD(0.5))
    grad = tf.IndexedSlices(tf.ones([1, 2]), tf.constant([3], tf.int64), tf.constant([5, 2]))
    wrapper.apply_gradients([(grad, table)])
    expected = np.ones([5, 2], np.float32)
    expected[3] -= 0.5
    np.testing.assert_allclose(table.numpy(), expected)


def test_sok_sgd():
    table = sok.DynamicVariable(2, initializer="ones")
    table.sparse_read(tf.constant([7], tf.int64))
    sok.SGD(0.25).apply_gradients([(tf.IndexedSlices(tf.ones([2, 2]), tf.constant([7, 7], tf.int64)),
                                    table)])
    np.testing.assert_allclose(table.sparse_read(tf.constant([7], tf.int64)).numpy(), [[0.5, 0.5]])


def test_unsupported_optimizer_names_the_supported_ones():
    table = sok.DynamicVariable(2)
    grad = tf.IndexedSlices(tf.ones([1, 2]), tf.constant([1], tf.int64))
    with pytest.raises(NotImplementedError, match="Lion is not supported .* supported: "):
        sok.OptimizerWrapper(tf.keras.optimizers.Lion(0.1)).apply_gradients([(grad, table)])
