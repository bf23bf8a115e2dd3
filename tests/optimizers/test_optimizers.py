"""OptimizerWrapper on dynamic tables against the same Keras optimizer on a tf.Variable.

The reference applies the optimizer to the touched rows only: where TF's own sparse update is
lazy already (SGD, momentum, Adagrad, legacy Adamax / Adadelta / Ftrl / RMSprop with momentum)
the reference is the Keras optimizer itself on a tf.Variable; where Keras' sparse update also
moves untouched rows (REFERENCE_OF), it is the optimizer's formulas applied to the touched
rows, in NumPy.
"""
import numpy as np
import pytest
import tensorflow as tf

import sparse_operation_kit as sok
from keras_optimizers import KERAS_3, LazyMomentum, keras_2_only, keras_optimizer, summed_duplicates

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
    "legacy_rmsprop_centered": lambda: tf.keras.optimizers.legacy.RMSprop(0.01, centered=True),
    "legacy_rmsprop_centered_momentum": lambda: tf.keras.optimizers.legacy.RMSprop(
        0.01, momentum=0.5, centered=True),
    "sgd": lambda: tf.keras.optimizers.SGD(0.05, momentum=0.9),
    "sgd_nesterov": lambda: tf.keras.optimizers.SGD(0.05, momentum=0.8, nesterov=True),
    "adagrad": lambda: tf.keras.optimizers.Adagrad(0.1),
    "adam": lambda: tf.keras.optimizers.Adam(0.01),
    "adam_schedule": lambda: tf.keras.optimizers.Adam(
        tf.keras.optimizers.schedules.ExponentialDecay(0.02, 5, 0.5)),
    "adamax": lambda: tf.keras.optimizers.Adamax(0.02),
    "adadelta": lambda: tf.keras.optimizers.Adadelta(1.0),
    "rmsprop": lambda: tf.keras.optimizers.RMSprop(0.01),
    "rmsprop_momentum": lambda: tf.keras.optimizers.RMSprop(0.01, momentum=0.5),
    "rmsprop_centered": lambda: tf.keras.optimizers.RMSprop(0.01, centered=True),
    "ftrl": lambda: tf.keras.optimizers.Ftrl(0.1, l1_regularization_strength=0.01,
                                             l2_regularization_strength=0.02, beta=0.1),
    "nadam": lambda: tf.keras.optimizers.Nadam(0.01),
}
if KERAS_3:  # no legacy optimizers to compare with
    OPTIMIZERS = {name: make for name, make in OPTIMIZERS.items() if not name.startswith("legacy")}
VOCAB, DIM, STEPS = 25, 4, 20


class LazyRmsprop:
    """Keras RMSprop on touched rows only (Keras decays every row's moments): ms = rho ms +
    (1 - rho) g^2, centered: mg = rho mg + (1 - rho) g and s = ms - mg^2 (else s = ms); with
    momentum mom = momentum mom + lr g / sqrt(s + eps), w -= mom; without it w -= lr g /
    (sqrt(s) + eps) (legacy) or lr g / sqrt(s + eps) (new Keras)."""

    def __init__(self, optimizer):
        self.legacy = hasattr(optimizer, "_get_hyper")
        self.lr, self.rho, self.epsilon = 0.01, 0.9, optimizer.epsilon
        self.momentum, self.centered = float(optimizer.momentum), optimizer.centered
        self.ms, self.mg, self.mom = {}, {}, {}

    def apply(self, table, rows, grads):
        values = table.numpy()
        for row, grad in zip(rows, grads):
            self.ms[row] = self.rho * self.ms.get(row, 0.0) + (1 - self.rho) * grad * grad
            square = self.ms[row]
            if self.centered:
                self.mg[row] = self.rho * self.mg.get(row, 0.0) + (1 - self.rho) * grad
                square = square - self.mg[row] ** 2
            if self.momentum:
                self.mom[row] = (self.momentum * self.mom.get(row, 0.0) +
                                 self.lr * grad / np.sqrt(square + self.epsilon))
                values[row] -= self.mom[row]
            elif self.legacy:
                values[row] -= self.lr * grad / (np.sqrt(square) + self.epsilon)
            else:
                values[row] -= self.lr * grad / np.sqrt(square + self.epsilon)
        table.assign(values)


class LazyAdamax:
    """Keras Adamax on touched rows only: m = b1 m + (1 - b1) g; u = max(b2 u, |g|);
    w -= lr / (1 - b1^t) m / (u + eps)."""

    def __init__(self, optimizer):
        self.lr, self.beta1, self.beta2, self.epsilon = 0.02, 0.9, 0.999, optimizer.epsilon
        self.step, self.m, self.u = 0, {}, {}

    def apply(self, table, rows, grads):
        self.step += 1
        values = table.numpy()
        for row, grad in zip(rows, grads):
            self.m[row] = self.beta1 * self.m.get(row, 0.0) + (1 - self.beta1) * grad
            self.u[row] = np.maximum(self.beta2 * self.u.get(row, 0.0), np.abs(grad))
            values[row] -= (self.lr / (1 - self.beta1 ** self.step) * self.m[row] /
                            (self.u[row] + self.epsilon))
        table.assign(values)


class LazyAdadelta:
    """Keras Adadelta on touched rows only: a = rho a + (1 - rho) g^2; u = sqrt(d + eps) /
    sqrt(a + eps) g; d = rho d + (1 - rho) u^2; w -= lr u."""

    def __init__(self, optimizer):
        self.lr, self.rho, self.epsilon = 1.0, 0.95, optimizer.epsilon
        self.accum, self.delta = {}, {}

    def apply(self, table, rows, grads):
        values = table.numpy()
        for row, grad in zip(rows, grads):
            accum = self.rho * self.accum.get(row, 0.0) + (1 - self.rho) * grad * grad
            delta = self.delta.get(row, 0.0)
            update = np.sqrt(delta + self.epsilon) / np.sqrt(accum + self.epsilon) * grad
            self.accum[row] = accum
            self.delta[row] = self.rho * delta + (1 - self.rho) * update * update
            values[row] -= self.lr * update
        table.assign(values)


class LazyFtrl:
    """Keras Ftrl (l2 shrinkage 0) on touched rows only (new Keras recomputes every row from
    its linear term): n' = n + g^2; z += g - (sqrt(n') - sqrt(n)) / lr w;
    w = (clip(z, -l1, l1) - z) / (sqrt(n') / lr + 2 (l2 + beta / (2 lr)))."""

    def __init__(self, optimizer):
        self.lr, self.l1 = 0.1, optimizer.l1_regularization_strength
        self.l2 = optimizer.l2_regularization_strength + optimizer.beta / (2 * self.lr)
        self.initial = optimizer.initial_accumulator_value
        self.accum, self.linear = {}, {}

    def apply(self, table, rows, grads):
        values = table.numpy()
        for row, grad in zip(rows, grads):
            accum = self.accum.get(row, self.initial)
            new_accum = accum + grad * grad
            linear = (self.linear.get(row, 0.0) + grad -
                      (np.sqrt(new_accum) - np.sqrt(accum)) / self.lr * values[row])
            quadratic = np.sqrt(new_accum) / self.lr + 2 * self.l2
            values[row] = (np.clip(linear, -self.l1, self.l1) - linear) / quadratic
            self.accum[row], self.linear[row] = new_accum, linear
        table.assign(values)


class LazyNadam:
    """Keras Nadam on touched rows only (Keras decays every row's moments): its momentum
    schedule m_t = b1 (1 - 0.5 * 0.96^(decay t)) (decay: legacy 0.004, new Keras 1) and
    running product, then
    w -= lr ((1 - m_t) g / (1 - prod_t) + m_t+1 m / (1 - prod_t+1)) / (sqrt(v / (1 - b2^t)) + eps)."""

    def __init__(self, optimizer):
        self.lr, self.beta1, self.beta2 = 0.01, 0.9, 0.999
        self.epsilon = optimizer.epsilon
        self.decay = float(optimizer._initial_decay) if hasattr(optimizer, "_get_hyper") else 1.0
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
        # the schedule itself where there is one (new Keras keeps it in _learning_rate)
        self.lr = optimizer._get_hyper("learning_rate") if hasattr(optimizer, "_get_hyper") \
            else optimizer._learning_rate
        self.beta1, self.beta2, self.epsilon = 0.9, 0.999, optimizer.epsilon
        self.step, self.m, self.v = 0, {}, {}

    def apply(self, table, rows, grads):
        rate = self.lr(self.step) if callable(self.lr) else self.lr.numpy()
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


LAZY_REFERENCES = (LazyAdam, LazyMomentum, LazyRmsprop, LazyNadam, LazyAdamax, LazyAdadelta,
                   LazyFtrl)
# Optimizers whose Keras sparse update also moves untouched rows: their lazy NumPy twins.
REFERENCE_OF = {
    "legacy_adam": LazyAdam, "legacy_adam_schedule": LazyAdam, "adam": LazyAdam,
    "sgd": LazyMomentum, "sgd_nesterov": LazyMomentum, "adam_schedule": LazyAdam,
    "legacy_rmsprop": LazyRmsprop, "legacy_rmsprop_centered": LazyRmsprop,
    "rmsprop": LazyRmsprop, "rmsprop_momentum": LazyRmsprop, "rmsprop_centered": LazyRmsprop,
    "legacy_nadam": LazyNadam, "nadam": LazyNadam, "adamax": LazyAdamax,
    "adadelta": LazyAdadelta, "ftrl": LazyFtrl,
}
REFERENCE_OF = {name: lazy for name, lazy in REFERENCE_OF.items() if name in OPTIMIZERS}


def touched_rows_reference(table, optimizer, ids):
    """One step of `optimizer` on the rows `ids` touch (a tf.Variable over the key universe)."""
    with tf.GradientTape() as tape:
        out = tf.reduce_sum(tf.gather(table, ids), axis=1)
        loss = tf.reduce_sum(out * out)
    grad = tape.gradient(loss, table)
    if isinstance(optimizer, LAZY_REFERENCES):
        dense = tf.convert_to_tensor(grad).numpy().astype(np.float64)
        rows = np.unique(ids.values.numpy())
        optimizer.apply(table, rows, dense[rows])
    else:
        optimizer.apply_gradients([(summed_duplicates(grad), table)])


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
    if name in REFERENCE_OF:
        ref_optimizer = REFERENCE_OF[name](ref_optimizer)

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


@pytest.mark.parametrize("name", sorted(REFERENCE_OF))
def test_lazy_references_equal_keras_when_every_row_is_touched(name):
    # The NumPy references above stand in for Keras where its sparse update is not lazy; when
    # every row is touched every step lazy and eager updates coincide, so they must equal Keras.
    rng = np.random.default_rng(5)
    initial = rng.normal(size=[VOCAB, DIM]).astype(np.float32)
    lazy, keras = tf.Variable(initial), tf.Variable(initial)
    reference, optimizer = REFERENCE_OF[name](OPTIMIZERS[name]()), OPTIMIZERS[name]()
    for _ in range(STEPS):
        rows = np.concatenate([np.arange(VOCAB), rng.integers(0, VOCAB, size=10)])
        ids = tf.RaggedTensor.from_row_lengths(tf.constant(rows, tf.int64), [VOCAB, 10])
        touched_rows_reference(lazy, reference, ids)
        touched_rows_reference(keras, optimizer, ids)
    # float64 NumPy against float32 Keras over rows grown to ~10: absolute rounding ~1e-5
    np.testing.assert_allclose(lazy.numpy(), keras.numpy(), rtol=1e-5, atol=1e-4)


@keras_2_only
@pytest.mark.parametrize("name", ["legacy_adam", "legacy_adam_schedule", "legacy_nadam"])
@pytest.mark.parametrize("mode", ["eager", "function"])
def test_static_tables_are_updated_lazily_under_adam_and_nadam(name, mode):
    """Keras' legacy Adam / Nadam move every row of a table each step; the wrapper updates a
    sok.Variable's touched rows only (Sok>StaticApply), its state in Keras' own m / v slots."""
    rng = np.random.default_rng(4)
    initial = rng.normal(size=[VOCAB + 5, DIM]).astype(np.float32)  # rows >= VOCAB: untouched
    table, reference = sok.Variable(initial), tf.Variable(initial)
    wrapper = sok.OptimizerWrapper(OPTIMIZERS[name]())
    ref_optimizer = REFERENCE_OF[name](OPTIMIZERS[name]())

    def sok_step(ids):
        with tf.GradientTape() as tape:
            out = sok.lookup_sparse([table], [ids], combiners=["sum"])[0]
            loss = tf.reduce_sum(out * out)
        wrapper.apply_gradients([(tape.gradient(loss, table), table)])

    steps = {"ragged": tf.function(sok_step), "one id": tf.function(sok_step)} \
        if mode == "function" else {"ragged": sok_step, "one id": sok_step}
    for step in range(STEPS):
        if step % 2:  # one id per sample: gradients keyed by id with duplicates
            rows = rng.integers(0, VOCAB, size=8)
            ids = tf.RaggedTensor.from_tensor(tf.constant(rows, tf.int64)[:, None])
            steps["one id"](ids)
        else:
            lengths = rng.integers(0, 4, size=6)
            rows = rng.integers(0, VOCAB, size=lengths.sum())
            ids = tf.RaggedTensor.from_row_lengths(tf.constant(rows, tf.int64), lengths)
            steps["ragged"](ids)
        touched_rows_reference(reference, ref_optimizer, ids)
    np.testing.assert_allclose(table.numpy(), reference.numpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(table.numpy()[VOCAB:], initial[VOCAB:])
    touched = sorted(ref_optimizer.m)
    m = wrapper.optimizer.get_slot(table, "m").numpy()
    np.testing.assert_allclose(m[touched], np.stack([ref_optimizer.m[r] for r in touched]),
                               rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(m[VOCAB:], 0.0)


@keras_2_only
def test_static_lazy_update_rejects_out_of_range_rows_before_writing():
    table = sok.Variable(np.ones([5, 2], np.float32), name="lazy_bad_rows")
    wrapper = sok.OptimizerWrapper(tf.keras.optimizers.legacy.Adam(0.1))
    grad = tf.IndexedSlices(tf.ones([2, 2]), tf.constant([1, 7], tf.int64), tf.constant([5, 2]))
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"id 7 of table 'lazy_bad_rows.*\[0, 5\)"):
        wrapper.apply_gradients([(grad, table)])
    np.testing.assert_array_equal(table.numpy(), np.ones([5, 2], np.float32))
    np.testing.assert_array_equal(wrapper.optimizer.get_slot(table, "m").numpy(), 0.0)


def test_static_variables_go_to_the_wrapped_optimizer():
    table = sok.Variable(np.ones([5, 2], np.float32))
    wrapper = sok.OptimizerWrapper(keras_optimizer("SGD", 0.5))
    grad = tf.IndexedSlices(tf.ones([1, 2]), tf.constant([3], tf.int64), tf.constant([5, 2]))
    wrapper.apply_gradients([(grad, table)])
    expected = np.ones([5, 2], np.float32)
    expected[3] -= 0.5
    np.testing.assert_allclose(table.numpy(), expected)


@pytest.mark.parametrize("name", ["Adagrad", "Adam", "RMSprop"])
def test_static_tables_get_repeated_ids_summed_under_every_keras(name):
    """A static table's gradient repeats an id once per occurrence; through the wrapper the
    optimizer applies their sum, as Keras 2 does and Keras 3 on its own does not."""
    initial = np.random.default_rng(3).normal(size=[6, 2]).astype(np.float32)
    table, reference = sok.Variable(initial), tf.Variable(initial)
    wrapper, keras = sok.OptimizerWrapper(keras_optimizer(name, 0.1)), keras_optimizer(name, 0.1)
    grad = tf.IndexedSlices(tf.constant([[1.0, 2.0], [3.0, -4.0], [0.5, 0.5]]),
                            tf.constant([4, 4, 1], tf.int64), tf.constant([6, 2], tf.int64))
    for _ in range(3):
        wrapper.apply_gradients([(grad, table)])
        keras.apply_gradients([(tf.IndexedSlices(tf.constant([[4.0, -2.0], [0.5, 0.5]]),
                                                 tf.constant([4, 1], tf.int64),
                                                 tf.constant([6, 2], tf.int64)), reference)])
    np.testing.assert_allclose(table.numpy(), reference.numpy(), rtol=1e-6, atol=1e-7)


def test_sok_sgd():
    table = sok.DynamicVariable(2, initializer="ones")
    table.sparse_read(tf.constant([7], tf.int64))
    sok.SGD(0.25).apply_gradients([(tf.IndexedSlices(tf.ones([2, 2]), tf.constant([7, 7], tf.int64)),
                                    table)])
    np.testing.assert_allclose(table.sparse_read(tf.constant([7], tf.int64)).numpy(), [[0.5, 0.5]])


@keras_2_only
@pytest.mark.parametrize("name", ["legacy_sgd", "legacy_adam", "legacy_adam_schedule"])
def test_fused_updates_read_their_hyper_parameters_on_the_host(name):
    """Tables on the host: the wrapper makes a legacy optimizer's hyper variables and step
    counter there and computes the fused ops' hyper vectors there, even in a step placed on a
    GPU (the CPU kernels read them on the host; a copy back from the GPU would make each step
    wait for it). GPU tables: tests/lookup/test_devices.py and test_dynamic_devices.py. The updates'
    values are checked against Keras by the tests above."""
    optimizer = OPTIMIZERS[name]()
    wrapper = sok.OptimizerWrapper(optimizer)
    with tf.device("CPU:0"):  # on the host also where TensorFlow would pick a GPU
        static, dynamic = sok.Variable(tf.ones([8, 4])), sok.DynamicVariable(4)
        ids = tf.constant([1, 5, 1], tf.int64)
        grad = tf.IndexedSlices(tf.ones([3, 4]), ids)

    def step():
        wrapper.apply_gradients([(grad, static), (grad, dynamic)])

    with tf.device("/GPU:0"):  # a placement request only: the graph is not run here
        graph = tf.function(step).get_concrete_function().graph
    for variable in list(optimizer._hyper.values()) + [wrapper.iterations]:
        if isinstance(variable, tf.Variable):
            assert "CPU" in variable.device, variable
    hypers = [op.inputs[-1].op for op in graph.get_operations()
              if op.type in ("Sok>StaticApply", "Sok>DynamicApply")]
    assert len(hypers) == 2 and all("CPU" in op.device for op in hypers), \
        [op.device for op in hypers]
    tf.function(step)()
    assert int(wrapper.iterations) == 1
