"""Sparse optimizers for sok tables.

`OptimizerWrapper(optimizer)` applies a Keras optimizer's update rule lazily: a dynamic
table's touched rows and their state change, in one fused op per table (Sok>DynamicApply).
A static `sok.Variable` under a legacy Adam or Nadam (whose Keras sparse updates move every
row of the table and its moments each step) is updated lazily too, by Sok>StaticApply, its
state kept in the wrapped optimizer's own slots ("m", "v"), so Keras checkpoints and
get_slot see it. Every other variable goes to the wrapped optimizer itself; TF's sparse
updates of the other legacy optimizers are lazy already.
Hyper-parameters and learning-rate schedules are read from the wrapped optimizer at each step.
"""
import tensorflow as tf

from sparse_operation_kit._ops import raw_ops
from sparse_operation_kit.dynamic_variable import DynamicVariable
from sparse_operation_kit.variables import Variable

_SUPPORTED = ("SGD", "Adagrad", "Adam", "Adamax", "Adadelta", "RMSprop", "Ftrl", "Nadam")
# Legacy optimizers whose Keras sparse update is not lazy, and their slots in the order the
# update rule packs a row's state.
_LAZY_STATIC_SLOTS = {"Adam": ["m", "v"], "Nadam": ["m", "v"]}


def _hyper(optimizer, name):
    if hasattr(optimizer, "_get_hyper"):  # tf.keras.optimizers.legacy
        return optimizer._get_hyper(name, tf.float32)
    return tf.cast(getattr(optimizer, name), tf.float32)


def _learning_rate(optimizer):
    if hasattr(optimizer, "_decayed_lr"):  # legacy: applies the schedule at `iterations`
        return optimizer._decayed_lr(tf.float32)
    rate = optimizer._learning_rate
    if isinstance(rate, tf.keras.optimizers.schedules.LearningRateSchedule):
        rate = rate(optimizer.iterations)
    return tf.cast(rate, tf.float32)


class OptimizerWrapper:
    """Wraps a Keras optimizer so it also trains sok dynamic tables, lazily.

    Supports SGD (momentum, nesterov), Adagrad, Adam, Adamax, Adadelta, RMSprop (plain,
    momentum, centered), Ftrl and Nadam, each from `tf.keras.optimizers.legacy` and from
    `tf.keras.optimizers`. Other optimizers raise NotImplementedError when they meet a
    dynamic table.
    """

    def __init__(self, optimizer):
        self._optimizer = optimizer
        self._kind = type(optimizer).__name__
        if getattr(optimizer, "amsgrad", False):
            raise NotImplementedError("amsgrad is not supported for sok dynamic tables")

    @property
    def optimizer(self):
        return self._optimizer

    def __getattr__(self, name):  # learning_rate, iterations, ...
        return getattr(self._optimizer, name)

    def apply_gradients(self, grads_and_vars, **kwargs):
        grads_and_vars = list(grads_and_vars)
        dynamic = [(g, v) for g, v in grads_and_vars if isinstance(v, DynamicVariable)]
        static = [(g, v) for g, v in grads_and_vars if self._lazy_static(g, v)]
        lazy = {id(v) for _, v in dynamic + static}
        others = [(g, v) for g, v in grads_and_vars if id(v) not in lazy]
        step = tf.cast(self._optimizer.iterations + 1, tf.float32)  # before `others` count it
        lr = _learning_rate(self._optimizer)
        if self._kind == "Nadam" and (dynamic or static):
            self._nadam_step = self._advance_nadam_schedule(step)
        updates = [self._apply_dynamic(g, v, lr, step) for g, v in dynamic if g is not None]
        updates += [self._apply_static(g, v, lr, step) for g, v in static]
        with tf.control_dependencies(updates):
            if others:
                return self._optimizer.apply_gradients(others, **kwargs)
            return self._optimizer.iterations.assign_add(1)

    def _lazy_static(self, grad, variable):
        return (isinstance(variable, Variable) and isinstance(grad, tf.IndexedSlices) and
                self._kind in _LAZY_STATIC_SLOTS and hasattr(self._optimizer, "_get_hyper") and
                not getattr(self._optimizer, "amsgrad", False))

    def _apply_static(self, grad, variable, lr, step):
        """Sok>StaticApply on the touched rows, state in the wrapped optimizer's slots."""
        with tf.init_scope():
            self._optimizer._create_all_weights([variable])
        slots = [self._optimizer.get_slot(variable, name)
                 for name in _LAZY_STATIC_SLOTS[self._kind]]
        rule, hyper, _, _, nesterov = self._rule(lr, step, variable.shape[1])
        return raw_ops.sok_static_apply(
            table=variable.handle, slots=[slot.handle for slot in slots],
            indices=tf.cast(grad.indices, tf.int64),
            grads=tf.convert_to_tensor(grad.values, tf.float32), hyper=hyper, rule=rule,
            nesterov=nesterov, table_name=variable.name)

    def _advance_nadam_schedule(self, step):
        """Keras' Nadam momentum schedule, kept here for the dynamic tables: m_t, m_t+1 and
        the products up to t and t + 1 (the product lives in a variable across steps)."""
        opt = self._optimizer
        if getattr(self, "_nadam_cache", None) is None:
            with tf.init_scope():
                self._nadam_cache = tf.Variable(1.0, trainable=False, name="sok_nadam_m_cache")
        beta1 = _hyper(opt, "beta_1")
        # Legacy Keras raises 0.96 to decay * t (decay defaults to 0.004); new Keras to t.
        decay = tf.constant(float(opt._initial_decay) if hasattr(opt, "_get_hyper") else 1.0)
        now = beta1 * (1.0 - 0.5 * tf.pow(0.96, decay * step))
        following = beta1 * (1.0 - 0.5 * tf.pow(0.96, decay * (step + 1.0)))
        schedule = self._nadam_cache.assign(self._nadam_cache * now)
        return now, following, schedule, schedule * following

    def _apply_dynamic(self, grad, variable, lr, step):
        if not isinstance(grad, tf.IndexedSlices):
            raise TypeError(f"the gradient of dynamic table {variable.name} must be "
                            f"tf.IndexedSlices keyed by id, got {type(grad).__name__}")
        rule, hyper, state_dim, state_initial, nesterov = self._rule(lr, step, variable.dimension)
        return raw_ops.sok_dynamic_apply(
            variable.handle, tf.cast(grad.indices, tf.int64),
            tf.convert_to_tensor(grad.values, tf.float32), hyper, rule=rule,
            state_dim=state_dim, state_initial_value=state_initial, nesterov=nesterov)

    def _rule(self, lr, step, dim):
        """(rule, hyper, state floats per row, their initial value, nesterov) of this step, as
        Sok>DynamicApply and Sok>StaticApply take them."""
        opt = self._optimizer
        legacy = hasattr(opt, "_get_hyper")
        if self._kind == "SGD":
            momentum = _hyper(opt, "momentum")
            has_momentum = bool(opt._momentum) if legacy else float(opt.momentum) != 0.0
            return ("sgd", tf.stack([lr, momentum]), dim if has_momentum else 0, 0.0,
                    bool(getattr(opt, "nesterov", False)))
        if self._kind == "Adagrad":
            initial = opt._initial_accumulator_value if legacy else opt.initial_accumulator_value
            epsilon = tf.cast(opt.epsilon, tf.float32)
            return ("adagrad", tf.stack([lr, epsilon, tf.constant(0.0 if legacy else 1.0)]), dim,
                    float(initial), False)
        if self._kind == "Adam":
            beta1, beta2 = _hyper(opt, "beta_1"), _hyper(opt, "beta_2")
            epsilon = tf.cast(opt.epsilon, tf.float32)
            corrected = lr * tf.sqrt(1.0 - tf.pow(beta2, step)) / (1.0 - tf.pow(beta1, step))
            return "adam", tf.stack([corrected, beta1, beta2, epsilon]), 2 * dim, 0.0, False
        epsilon = tf.constant(float(opt.epsilon), tf.float32) if hasattr(opt, "epsilon") else None
        if self._kind == "Adamax":
            beta1, beta2 = _hyper(opt, "beta_1"), _hyper(opt, "beta_2")
            corrected = lr / (1.0 - tf.pow(beta1, step))
            return "adamax", tf.stack([corrected, beta1, beta2, epsilon]), 2 * dim, 0.0, False
        if self._kind == "Adadelta":
            return ("adadelta", tf.stack([lr, _hyper(opt, "rho"), epsilon]), 2 * dim, 0.0,
                    False)
        if self._kind == "RMSprop":
            momentum = _hyper(opt, "momentum")
            if (not opt._momentum) if legacy else float(opt.momentum) == 0.0:
                momentum = tf.constant(0.0)
            hyper = tf.stack([lr, _hyper(opt, "rho"), momentum, epsilon,
                              tf.constant(1.0 if opt.centered else 0.0),
                              tf.constant(0.0 if legacy else 1.0)])
            return "rmsprop", hyper, (3 if opt.centered else 2) * dim, 0.0, False
        if self._kind == "Nadam":
            now, following, schedule, schedule_next = self._nadam_step
            beta2 = _hyper(opt, "beta_2")
            if legacy:  # legacy Nadam uses `decay` for its momentum schedule, not the rate
                rate = opt._get_hyper("learning_rate")
                lr = tf.cast(rate(opt.iterations) if callable(rate) else rate, tf.float32)
            hyper = tf.stack([lr, _hyper(opt, "beta_1"), beta2, epsilon, now, following,
                              1.0 - schedule, 1.0 - schedule_next, 1.0 - tf.pow(beta2, step)])
            return "nadam", hyper, 2 * dim, 0.0, False
        if self._kind == "Ftrl":
            l2 = _hyper(opt, "l2_regularization_strength") + _hyper(opt, "beta") / (2.0 * lr)
            shrinkage = (opt._l2_shrinkage_regularization_strength if legacy
                         else opt.l2_shrinkage_regularization_strength)
            initial = opt._initial_accumulator_value if legacy else opt.initial_accumulator_value
            hyper = tf.stack([lr, _hyper(opt, "learning_rate_power"),
                              _hyper(opt, "l1_regularization_strength"), l2,
                              tf.constant(float(shrinkage))])
            return "ftrl", hyper, 2 * dim, float(initial), False
        raise NotImplementedError(
            f"{self._kind} is not supported for sok dynamic tables yet; supported: {_SUPPORTED}")


def SGD(lr=0.01):  # noqa: N802  (SOK's name)
    """Plain SGD for sok tables: `sok.SGD(lr).apply_gradients(grads_and_vars)`."""
    return OptimizerWrapper(tf.keras.optimizers.legacy.SGD(lr))
