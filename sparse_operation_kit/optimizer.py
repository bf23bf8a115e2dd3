"""Sparse optimizers for sok tables.

`OptimizerWrapper(optimizer)` applies a Keras optimizer's update rule lazily: a dynamic
table's touched rows and their state change, in one fused op per table (Sok>DynamicApply).
A static `sok.Variable` under a legacy Adam or Nadam (whose Keras sparse updates move every
row of the table and its moments each step) is updated lazily too, by Sok>StaticApply, its
state kept in the wrapped optimizer's own slots ("m", "v"), so Keras checkpoints and
get_slot see it. So is one under a plain legacy SGD (no momentum, no clipping): one fused
scatter per table instead of Keras' multiply and scatter, and on the GPU no second check of
ids that lookup_sparse has checked. Every other variable goes to the wrapped optimizer itself; TF's sparse
updates of the other legacy optimizers are lazy already.
Hyper-parameters and learning-rate schedules are read from the wrapped optimizer at each step.
"""
import tensorflow as tf

from sparse_operation_kit import _versions
from sparse_operation_kit._ops import raw_ops
from sparse_operation_kit.dynamic_variable import DynamicSlot, DynamicVariable
from sparse_operation_kit.id_checks import indices_are_checked
from sparse_operation_kit.lookup_inputs import on_gpu_device
from sparse_operation_kit.lookup_gradients import pooled_gradient_shares
from sparse_operation_kit.optimizer_rules import hyper_vector, slot_names
from sparse_operation_kit.variables import Variable

# The Keras optimizers with a fused sparse rule, and the rule's name in the rule table
# (optimizer_rules.py: hyper-parameters and state slots by name).
_RULE_OF = {"SGD": "sgd", "Adagrad": "adagrad", "Adam": "adam", "Adamax": "adamax",
            "Adadelta": "adadelta", "RMSprop": "rmsprop", "Ftrl": "ftrl", "Nadam": "nadam"}
_SUPPORTED = tuple(_RULE_OF)
# Legacy optimizers whose Keras sparse update is not lazy (their slots, in the order the update
# rule packs a row's state: _rule_slots).
_LAZY_STATIC = ("Adam", "Nadam", "SGD")


def _has_momentum(optimizer):  # SGD and RMSprop
    if hasattr(optimizer, "_get_hyper"):  # tf.keras.optimizers.legacy
        return bool(optimizer._momentum)
    return float(optimizer.momentum) != 0.0


def _rule_slots(optimizer):
    """The fused rule's state slots under a Keras optimizer, in storage order (a dynamic
    table keeps them as consecutive [dim] sections after each row)."""
    kind = type(optimizer).__name__
    if kind not in _RULE_OF or getattr(optimizer, "amsgrad", False):
        return []
    if kind == "SGD":
        return slot_names("sgd", keep_last=_has_momentum(optimizer))
    if kind == "RMSprop":
        return slot_names("rmsprop", keep_last=optimizer.centered)
    return slot_names(_RULE_OF[kind])


def dynamic_slot_names(optimizer):
    """Names of the [dim] state slots a dynamic table keeps per row under `optimizer` (a Keras
    optimizer, or an OptimizerWrapper), in storage order; Keras' slot names."""
    if getattr(optimizer, "_fused", True) is False:
        return []  # the generic path keeps slots in their own tables (get_slot)
    return _rule_slots(getattr(optimizer, "optimizer", optimizer))


def shown_slot_names(optimizer):
    """The dynamic-table slots that `get_slot_names`, `_slots` and `sok.dump` show: those the
    Keras optimizer itself makes (RMSprop keeps a `momentum` column but makes no such slot
    when its momentum is 0, and SOK shows none then)."""
    names = dynamic_slot_names(optimizer)
    inner = getattr(optimizer, "optimizer", optimizer)
    if type(inner).__name__ == "RMSprop" and "momentum" in names and not _has_momentum(inner):
        names.remove("momentum")
    return names


def _hyper(optimizer, name):
    if hasattr(optimizer, "_get_hyper"):  # tf.keras.optimizers.legacy
        return optimizer._get_hyper(name, tf.float32)
    return tf.cast(getattr(optimizer, name), tf.float32)


def _learning_rate(optimizer, steps):
    """The rate at step count `steps`, as Keras computes it at its `iterations` (a schedule;
    a legacy optimizer's `decay` too)."""
    legacy = hasattr(optimizer, "_get_hyper")
    rate = optimizer._get_hyper("learning_rate") if legacy else optimizer._learning_rate
    if isinstance(rate, tf.keras.optimizers.schedules.LearningRateSchedule):
        rate = rate(steps)
    rate = tf.cast(rate, tf.float32)
    if legacy and optimizer._initial_decay > 0.0:
        rate = rate / (1.0 + float(optimizer._initial_decay) * tf.cast(steps, tf.float32))
    return rate


def _wrapper_variable(optimizer, name, initial, dtype, device):
    """A variable the wrappers of `optimizer` keep beside its own state (their step count, the
    Nadam schedule's product), made on `device` at first use and tracked by the optimizer, so
    a checkpoint of the optimizer holds it."""
    variable = optimizer._lookup_dependency(name)
    if variable is None:
        with tf.init_scope(), tf.device(device):
            variable = tf.Variable(initial, dtype=dtype, trainable=False, name=name)
        optimizer._track_trackable(variable, name=name, overwrite=True)
    return variable


def _dimension(table):
    return table.dimension if isinstance(table, DynamicVariable) else int(table.shape[1])


def _hyper_device(dynamic, static):  # lists of (gradient, table)
    """Where the fused updates want their hyper-parameters: the GPU of GPU-placed tables,
    whose Sok>StaticApply / Sok>DynamicApply kernels read them in device memory (a step with
    parts on the host runs as a two-device function, about 0.3 ms a step on an H100);
    otherwise the host, where the CPU kernels read them."""
    gpu = [v.handle.device for _, v in static + dynamic if on_gpu_device(v.handle)]
    return gpu[0] if gpu else "CPU:0"


def _hyper_state_on(optimizer, device):
    """Creates a legacy optimizer's hyper-parameter variables and step counter on `device` if
    it has not made them yet (Keras would pick the default device)."""
    if not hasattr(optimizer, "_create_hypers"):
        return
    with tf.init_scope(), tf.device(device):
        if not optimizer._hypers_created:
            optimizer._create_hypers()
        optimizer.iterations  # noqa: B018  (created on first access)


def _device(variable):
    """A variable's device (a Keras 3 variable's is its tf.Variable's)."""
    return variable.device if isinstance(variable, tf.Variable) else variable.value.device


def _is_keras_3(optimizer):
    """Whether `optimizer` is a Keras 3 optimizer (only those have stateless_apply)."""
    return hasattr(_unwrapped(optimizer), "stateless_apply")


def _summed_duplicates(grad):
    """An IndexedSlices gradient with each index once, its rows summed, as TensorFlow's dense
    gradients and Keras 2's optimizers apply it. A Keras 3 optimizer applies repeated indices
    row by row (Adagrad squares each part apart, momentum and Adam mix them into state), so
    the wrapper hands it summed gradients: sok tables train alike under both generations."""
    if not isinstance(grad, tf.IndexedSlices):
        return grad
    unique, position = tf.unique(grad.indices)
    values = tf.math.unsorted_segment_sum(grad.values, position, tf.size(unique))
    return tf.IndexedSlices(values, unique, grad.dense_shape)


def _slot_prefix(variable):
    """How a Keras 3 optimizer begins the names of a variable's slots."""
    name = variable.path if hasattr(variable, "path") else variable.name
    return name.replace("/", "_").replace(":", "_") + "_"


def static_slots(optimizer, variable):
    """{slot name: slot variable} an optimizer (or a wrapper's) keeps for a variable: through
    get_slot for legacy and Keras 2 optimizers. A Keras 3 optimizer has no get_slot: it keeps
    each kind of slot in a list by the variable's index, naming each "<variable>_<slot>"
    (nothing before it is built)."""
    inner = _unwrapped(getattr(optimizer, "optimizer", optimizer))
    if hasattr(inner, "get_slot_names"):
        slots = {}
        for name in inner.get_slot_names():
            try:
                slots[name] = inner.get_slot(variable, name)
            except (KeyError, ValueError):
                continue
        return slots
    try:
        index = inner._get_variable_index(variable)
    except (AttributeError, KeyError):
        return {}
    count, prefix = len(inner._trainable_variables), _slot_prefix(variable)
    slots = {}
    for kind in vars(inner).values():
        if isinstance(kind, (list, tuple)) and len(kind) == count and \
                getattr(kind[index], "name", "").startswith(prefix):
            slot = kind[index]
            slots[slot.name[len(prefix):]] = slot if isinstance(slot, tf.Variable) else slot.value
    return slots


def _unwrapped(optimizer):
    """The optimizer that owns the slots (a LossScaleOptimizer's inner one)."""
    return getattr(optimizer, "inner_optimizer", None) or optimizer


def _builds_all_at_once(optimizer):
    """Whether `optimizer` is a new Keras optimizer: it makes every variable's slots in one
    build(var_list) and knows no variable outside that list."""
    inner = _unwrapped(optimizer)
    return (hasattr(inner, "build") and hasattr(inner, "_var_key") and
            not hasattr(inner, "_create_all_weights"))


def _create_slots(optimizer, variable):
    """Makes `optimizer`'s slots for `variable` now (legacy Keras or TF1 optimizers)."""
    inner = _unwrapped(optimizer)
    with tf.init_scope():
        if hasattr(inner, "_create_all_weights"):  # tf.keras.optimizers.legacy
            inner._create_all_weights([variable])
        elif hasattr(inner, "_create_slots"):  # tf.compat.v1.train
            inner._create_slots([variable])
        else:
            raise NotImplementedError(
                f"{type(inner).__name__} has no fused sok rule and makes its slots in a way "
                "the generic path cannot prepare; use a legacy Keras or a TF1 optimizer")


def _staged_gradient(summed, positions, buffer):
    """The gradient of the staging buffer: rows [0, count) each appear once, so a sparse and a
    dense update agree on them, and the rest are reloaded before they are read. On a GPU the
    gradient is dense: TensorFlow has no GPU kernel for several sparse updates (momentum,
    Adagrad, RMSprop)."""
    if "GPU" in buffer.device.upper():
        return tf.scatter_nd(tf.expand_dims(positions, 1), summed, tf.shape(buffer))
    return tf.IndexedSlices(summed, positions, dense_shape=tf.shape(buffer))


class _Staging:
    """The generic path's per-table state: a staging variable the wrapped optimizer updates
    (its first n rows hold a step's n touched rows), and one dynamic table per optimizer slot
    holding that slot's rows by key, created with the slot's initial value."""

    def __init__(self, optimizer, table, rows):
        with tf.init_scope():
            self.buffer = tf.Variable(tf.zeros([rows, table.dimension]), trainable=False,
                                      name=f"{table.name.split(':')[0]}_sok_staging")
        self.table = table
        self.slots = {}
        if _builds_all_at_once(optimizer):
            return  # slots come with the optimizer's build (attach_built_slots)
        _create_slots(optimizer, self.buffer)
        inner = _unwrapped(optimizer)
        for name in inner.get_slot_names():
            try:
                slot = inner.get_slot(self.buffer, name)
            except KeyError:
                slot = None
            if slot is not None:
                self._add_slot(inner, name, slot)

    def attach_built_slots(self, inner):
        """After a new Keras optimizer's build: its variables made from the buffer become this
        staging's slots (Keras 2 names them "<slot>/<buffer>", Keras 3 "<buffer>_<slot>")."""
        keras_2_suffix = "/" + self.buffer._shared_name
        keras_3_prefix = self.buffer.name.replace("/", "_").replace(":", "_") + "_"
        for variable in inner.variables:
            name = variable.name.split(":")[0]
            if name.endswith(keras_2_suffix):  # under the optimizer's name scope
                slot_name = name[:-len(keras_2_suffix)].split("/")[-1]
            elif name.startswith(keras_3_prefix):
                slot_name = name[len(keras_3_prefix):]
            elif name == self.buffer.name.split(":")[0]:  # Keras 3 Adafactor's factored state
                slot_name = name
            else:
                continue
            if variable.shape != self.buffer.shape:
                raise NotImplementedError(
                    f"{type(inner).__name__} keeps state {name} of shape {variable.shape}, not "
                    "one row per table row; the generic path stages row-wise state only")
            # A Keras 3 variable holds the tf.Variable the staging reads and scatters into.
            self._add_slot(inner, slot_name,
                           variable if isinstance(variable, tf.Variable) else variable.value)

    def _add_slot(self, inner, name, slot):
        table = self.table
        with tf.init_scope():
            initial = float(slot[0, 0].numpy()) if slot.shape[0] else 0.0
            slot_table = DynamicVariable(
                table.dimension, initializer=repr(initial), mode=table.mode,
                name=f"{table.name.split(':')[0]}/{type(inner).__name__}/{name}",
                trainable=False, max_capacity=table._revival["config"]["max_capacity"],
                evict_strategy=table._revival["config"]["evict_strategy"])
        self.slots[name] = (slot, slot_table)
        # A tf.train.Checkpoint of the table carries the slot's rows too; restoring into a
        # new table fills the slot table when a wrapper makes it (deferred restoration).
        table._track_trackable(slot_table, name=f"sok_generic_slot/{type(inner).__name__}/{name}",
                               overwrite=True)


class OptimizerWrapper:
    """Wraps a Keras optimizer so it also trains sok dynamic tables, lazily.

    SGD (momentum, nesterov), Adagrad, Adam, Adamax, Adadelta, RMSprop (plain, momentum,
    centered), Ftrl and Nadam, each from `tf.keras.optimizers.legacy` and from
    `tf.keras.optimizers`, update a dynamic table in one fused op (state stored next to the
    rows). Any other optimizer with slots (TF1 `tf.compat.v1.train` optimizers, a legacy
    `LossScaleOptimizer`, Adam with amsgrad, custom legacy optimizers, new Keras AdamW / Lion)
    takes the generic path: a step's touched rows and their slot rows are gathered into a
    staging variable of `generic_rows` rows, the wrapped optimizer updates it, and the rows
    are written back (slot rows live in one dynamic table per slot: `get_slot(table, name)`).
    """

    def __init__(self, optimizer, generic_rows=65536):
        self._optimizer = optimizer
        self._kind = type(optimizer).__name__
        self._dynamic_tables = {}  # id -> table, every dynamic table this wrapper updated
        self._fused = self._kind in _SUPPORTED and not getattr(optimizer, "amsgrad", False)
        self._generic_rows = int(generic_rows)
        self._staging = {}  # id(table) -> _Staging, generic path only

    @property
    def optimizer(self):
        return self._optimizer

    def __getattr__(self, name):  # learning_rate, iterations, ...
        return getattr(self._optimizer, name)

    # --- SOK's surface ---------------------------------------------------------------------
    @property
    def lr(self):
        return self._optimizer.learning_rate

    @property
    def iterations(self):
        """The steps this wrapper applied to sok tables with a fused rule (the wrapped
        optimizer's `iterations` counts its own apply_gradients calls, as in SOK); under the
        generic path, the wrapped optimizer's `iterations`, which counts every step."""
        if not self._fused:
            return self._optimizer.iterations
        return _wrapper_variable(self._optimizer, "sok_iterations", 0, tf.int64,
                                 _device(self._optimizer.iterations))

    def get_slot_names(self):
        """The wrapped optimizer's slot names, and those its dynamic tables keep."""
        names = list(self._optimizer.get_slot_names()) \
            if hasattr(self._optimizer, "get_slot_names") else []
        return names + [n for n in shown_slot_names(self._optimizer) if n not in names]

    def get_slot(self, var, name):
        """A slot of `var`: for a dynamic table a DynamicSlot view of its state in the table
        (the generic path: the slot's own dynamic table), otherwise the wrapped optimizer's
        slot variable."""
        if isinstance(var, DynamicVariable) and not self._fused:
            staging = self._staging.get(id(var))
            if staging is None or name not in staging.slots:
                raise KeyError(f"no slot {name!r} for dynamic table {var.name} yet (slots "
                               "appear at its first update)")
            return staging.slots[name][1]
        if isinstance(var, DynamicVariable):
            names = dynamic_slot_names(self._optimizer)
            if name not in names:
                raise KeyError(f"{self._kind} keeps no slot {name!r} for dynamic table "
                               f"{var.name}; its slots are {names}")
            return DynamicSlot(var, name, names.index(name))
        slots = static_slots(self._optimizer, var)
        if name not in slots:
            raise KeyError(f"{self._kind} keeps no slot {name!r} for {var.name}; it keeps "
                           f"{sorted(slots)}")
        return slots[name]

    @property
    def _slots(self):
        """{variable key: {slot name: slot}}: the wrapped optimizer's (legacy Keras keeps
        them here) and each updated dynamic table's views, keyed by its unique id."""
        slots = dict(getattr(self._optimizer, "_slots", {}))
        for table in self._dynamic_tables.values():
            names = (shown_slot_names(self._optimizer) if self._fused else
                     list(self._staging[id(table)].slots) if id(table) in self._staging else [])
            slots[table._unique_id] = {name: self.get_slot(table, name) for name in names}
        return slots

    def apply_gradients(self, grads_and_vars, global_step=None, name=None, **kwargs):
        """Updates sok tables lazily and hands the other variables to the wrapped optimizer.
        global_step (TF1 style), when given, is incremented after the update."""
        update = self._apply(grads_and_vars, name=name, **kwargs)
        if global_step is None:
            return update
        with tf.control_dependencies([update]):
            return global_step.assign_add(1)

    def _apply(self, grads_and_vars, name=None, **kwargs):
        if name is not None:
            kwargs["name"] = name
        grads_and_vars = list(grads_and_vars)
        for _, v in grads_and_vars:
            if isinstance(v, DynamicVariable):
                self._dynamic_tables[id(v)] = v
        dynamic = [(g, v) for g, v in grads_and_vars if isinstance(v, DynamicVariable)]
        if not self._fused:
            return self._apply_generic(dynamic, [(g, v) for g, v in grads_and_vars
                                                 if not isinstance(v, DynamicVariable)], kwargs)
        static = [(g, v) for g, v in grads_and_vars if self._lazy_static(g, v)]
        lazy = {id(v) for _, v in dynamic + static}
        others = [(g, v) for g, v in grads_and_vars if id(v) not in lazy]
        # The hyper-parameters are computed where the fused ops read them, from variables
        # there: no step waits for a copy between host and GPU.
        device = _hyper_device(dynamic, static)
        _hyper_state_on(self._optimizer, device)
        # The sok tables' steps are counted apart from the optimizer's `iterations`, as SOK
        # does: one optimizer object may also update tf.Variables in calls of its own, and
        # each side's bias corrections and schedules follow its own step count.
        steps = _wrapper_variable(self._optimizer, "sok_iterations", 0, tf.int64, device)
        with tf.device(device):
            step = tf.cast(steps + 1, tf.float32)
            lr = _learning_rate(self._optimizer, steps)
            if self._kind == "Nadam" and (dynamic or static):
                self._nadam_step = self._advance_nadam_schedule(step, device)
            rules = {dim: self._rule(lr, step, dim, steps)
                     for dim in {_dimension(v) for g, v in dynamic + static if g is not None}}
        updates = [self._apply_dynamic(g, v, rules[_dimension(v)])
                   for g, v in dynamic if g is not None]
        updates += [self._apply_static(group, rules[dim])
                    for dim, group in _static_update_groups(static)]
        with tf.control_dependencies(updates):
            counted = steps.assign_add(1)
        if not others:
            return counted
        if _is_keras_3(self._optimizer):
            others = [(_summed_duplicates(g), v) for g, v in others]
        with tf.control_dependencies([counted]):
            return self._optimizer.apply_gradients(others, **kwargs)

    def _staging_for(self, table):
        """The generic path's staging of `table` (made at its first update or load)."""
        if id(table) not in self._staging:
            self._staging[id(table)] = _Staging(self._optimizer, table, self._generic_rows)
        return self._staging[id(table)]

    def generic_slot_tables(self, table, create=False):
        """{slot name: dynamic table of that slot's rows} of `table` under the generic path
        ({} for fused optimizers); `create` makes them if `table` has not been updated yet."""
        if self._fused or (id(table) not in self._staging and not create):
            return {}
        return {name: slot_table for name, (_, slot_table) in
                self._staging_for(table).slots.items()}

    def _build_with_staging(self, tables, others):
        """A new Keras optimizer makes every variable's slots in its one build: at the first
        step, the staging buffers of every table seen so far are built with the other
        variables of that step."""
        inner = _unwrapped(self._optimizer)
        if getattr(inner, "_built", False) or getattr(inner, "built", False):  # Keras 2, 3
            missing = [t.name for t in tables if id(t) not in self._staging]
            if missing:
                raise NotImplementedError(
                    f"{type(inner).__name__} was built before the sok tables {missing} reached "
                    "it, and a new Keras optimizer cannot add variables later: pass the tables' "
                    "gradients in its first apply_gradients, or use a legacy optimizer")
            return
        for table in tables:
            self._staging_for(table)
        stagings = list(self._staging.values())
        with tf.init_scope():
            inner.build(list(others) + [staging.buffer for staging in stagings])
        for staging in stagings:
            staging.attach_built_slots(inner)

    def _apply_generic(self, dynamic, others, kwargs):
        """Stages each dynamic table's touched rows and slot rows, lets the wrapped optimizer
        update them with the other variables in one apply_gradients, writes them back."""
        if _builds_all_at_once(self._optimizer):
            self._build_with_staging([table for grad, table in dynamic if grad is not None],
                                     [v for _, v in others])
        staged, write_back = [], []
        for grad, table in dynamic:
            if grad is None:
                continue
            if not isinstance(grad, tf.IndexedSlices):
                raise TypeError(f"the gradient of dynamic table {table.name} must be "
                                f"tf.IndexedSlices keyed by id, got {type(grad).__name__}")
            staging = self._staging_for(table)
            keys, index = tf.unique(tf.cast(grad.indices, tf.int64))
            count = tf.size(keys)
            check = tf.debugging.assert_less_equal(
                count, self._generic_rows,
                message=f"{table.name}: more touched rows in one step than the generic path's "
                        f"generic_rows={self._generic_rows}; raise it in OptimizerWrapper")
            with tf.control_dependencies([check]):
                positions = tf.range(count)
            summed = tf.math.unsorted_segment_sum(tf.convert_to_tensor(grad.values), index,
                                                  count)
            loads = [staging.buffer.scatter_update(
                tf.IndexedSlices(table.sparse_read(keys), positions))]
            for slot, slot_table in staging.slots.values():
                loads.append(slot.scatter_update(
                    tf.IndexedSlices(slot_table.sparse_read(keys), positions)))
            with tf.control_dependencies(loads):
                summed = tf.identity(summed)
            staged.append((_staged_gradient(summed, positions, staging.buffer),
                           staging.buffer))
            write_back.append((table, staging, keys, positions))
        update = self._optimizer.apply_gradients(staged + others, **kwargs)
        writes = []
        with tf.control_dependencies([update] if update is not None else []):
            for table, staging, keys, positions in write_back:
                writes.append(table.assign(keys, tf.gather(staging.buffer, positions)))
                for slot, slot_table in staging.slots.values():
                    writes.append(slot_table.assign(keys, tf.gather(slot, positions)))
        return tf.group(writes) if writes else update

    def _lazy_static(self, grad, variable):
        # Sok>StaticApply updates float32 tables; 16-bit ones go to the wrapped optimizer.
        return (isinstance(variable, Variable) and variable.dtype == tf.float32 and
                isinstance(grad, tf.IndexedSlices) and
                self._kind in _LAZY_STATIC and hasattr(self._optimizer, "_get_hyper") and
                not getattr(self._optimizer, "amsgrad", False) and
                (self._kind != "SGD" or self._plain_sgd()))

    def _plain_sgd(self):
        opt = self._optimizer
        return (not opt._momentum and opt.clipnorm is None and opt.clipvalue is None and
                opt.global_clipnorm is None)

    def _apply_static(self, group, rule_of_step):
        """One Sok>StaticApply for a group of tables (_static_update_groups) on their touched
        rows, state in the wrapped optimizer's slots."""
        with tf.init_scope():
            self._optimizer._create_all_weights([variable for _, variable, _ in group])
        slots = [self._optimizer.get_slot(variable, name)
                 for _, variable, _ in group for name in _rule_slots(self._optimizer)]
        rule, hyper, _, _, nesterov = rule_of_step
        gathered = group[0][2] is not None
        return raw_ops.sok_static_apply(
            tables=[variable.handle for _, variable, _ in group],
            slots=[slot.handle for slot in slots],
            indices=[tf.cast(grad.indices, tf.int64) for grad, _, _ in group],
            grads=[shares[0] if gathered else tf.convert_to_tensor(grad.values, tf.float32)
                   for grad, _, shares in group],
            grad_rows=[shares[1] for _, _, shares in group] if gathered else [],
            grad_scales=[shares[2] for _, _, shares in group] if gathered else [],
            hyper=hyper, rule=rule, nesterov=nesterov,
            table_names=[variable.name for _, variable, _ in group],
            validate=not indices_are_checked(group[0][0].indices))

    def _advance_nadam_schedule(self, step, device):
        """Keras' Nadam momentum schedule, kept here for the sok tables: m_t, m_t+1 and the
        products up to t and t + 1 (the product lives in a variable across steps)."""
        opt = self._optimizer
        cache = _wrapper_variable(opt, "sok_nadam_m_cache", 1.0, tf.float32, device)
        beta1 = _hyper(opt, "beta_1")
        # Legacy Keras raises 0.96 to decay * t (decay defaults to 0.004); new Keras to t.
        decay = tf.constant(float(opt._initial_decay) if hasattr(opt, "_get_hyper") else 1.0)
        now = beta1 * (1.0 - 0.5 * tf.pow(0.96, decay * step))
        following = beta1 * (1.0 - 0.5 * tf.pow(0.96, decay * (step + 1.0)))
        schedule = cache.assign(cache * now)
        return now, following, schedule, schedule * following

    def _apply_dynamic(self, grad, variable, rule_of_step):
        if not isinstance(grad, tf.IndexedSlices):
            raise TypeError(f"the gradient of dynamic table {variable.name} must be "
                            f"tf.IndexedSlices keyed by id, got {type(grad).__name__}")
        rule, hyper, state_dim, state_initial, nesterov = rule_of_step
        return raw_ops.sok_dynamic_apply(
            variable.handle, tf.cast(grad.indices, tf.int64),
            tf.convert_to_tensor(grad.values, tf.float32), hyper, rule=rule,
            state_dim=state_dim, state_initial_value=state_initial, nesterov=nesterov)

    def _rule(self, lr, step, dim, steps):
        """(rule, hyper, state floats per row, their initial value, nesterov) of this step, as
        Sok>DynamicApply and Sok>StaticApply take them."""
        opt = self._optimizer
        if self._kind not in _RULE_OF:
            raise NotImplementedError(f"{self._kind} is not supported for sok dynamic tables "
                                      f"yet; supported: {_SUPPORTED}")
        rule = _RULE_OF[self._kind]
        values, initial = self._hyper_values(lr, step, steps)
        state_dim = len(_rule_slots(opt)) * dim
        nesterov = self._kind == "SGD" and bool(getattr(opt, "nesterov", False))
        return rule, hyper_vector(rule, **values), state_dim, initial, nesterov

    def _hyper_values(self, lr, step, steps):
        """The fused rule's hyper-parameters of this step by name (optimizer_rules.py), and
        the initial value of its state."""
        opt = self._optimizer
        legacy = hasattr(opt, "_get_hyper")
        kind = self._kind
        if kind == "SGD":
            return {"lr": lr, "momentum": _hyper(opt, "momentum")}, 0.0
        initial = 0.0
        if kind in ("Adagrad", "Ftrl"):
            initial = float(opt._initial_accumulator_value if legacy
                            else opt.initial_accumulator_value)
        epsilon = tf.cast(opt.epsilon, tf.float32) if hasattr(opt, "epsilon") else None
        if kind == "Adagrad":  # Keras 3-style epsilon inside the square root; legacy outside
            return {"lr": lr, "epsilon": epsilon,
                    "epsilon_inside_sqrt": 0.0 if legacy else 1.0}, initial
        if kind in ("Adam", "Adamax"):
            beta1, beta2 = _hyper(opt, "beta_1"), _hyper(opt, "beta_2")
            if kind == "Adam":
                corrected = lr * tf.sqrt(1.0 - tf.pow(beta2, step)) / (1.0 - tf.pow(beta1, step))
            else:
                corrected = lr / (1.0 - tf.pow(beta1, step))
            return {"lr": corrected, "beta1": beta1, "beta2": beta2, "epsilon": epsilon}, initial
        if kind == "Adadelta":
            return {"lr": lr, "rho": _hyper(opt, "rho"), "epsilon": epsilon}, initial
        if kind == "RMSprop":
            momentum = _hyper(opt, "momentum") if _has_momentum(opt) else 0.0
            return {"lr": lr, "rho": _hyper(opt, "rho"), "momentum": momentum,
                    "epsilon": epsilon, "centered": 1.0 if opt.centered else 0.0,
                    "epsilon_inside_sqrt": 0.0 if legacy else 1.0}, initial
        if kind == "Nadam":
            now, following, schedule, schedule_next = self._nadam_step
            beta2 = _hyper(opt, "beta_2")
            if legacy:  # legacy Nadam uses `decay` for its momentum schedule, not the rate
                rate = opt._get_hyper("learning_rate")
                lr = tf.cast(rate(steps) if callable(rate) else rate, tf.float32)
            return {"lr": lr, "beta1": _hyper(opt, "beta_1"), "beta2": beta2,
                    "epsilon": epsilon, "momentum_now": now, "momentum_next": following,
                    "one_minus_schedule": 1.0 - schedule,
                    "one_minus_schedule_next": 1.0 - schedule_next,
                    "one_minus_beta2_power": 1.0 - tf.pow(beta2, step)}, initial
        # Ftrl: beta folds into l2 as beta / (2 lr)
        shrinkage = (opt._l2_shrinkage_regularization_strength if legacy
                     else opt.l2_shrinkage_regularization_strength)
        l2 = _hyper(opt, "l2_regularization_strength") + _hyper(opt, "beta") / (2.0 * lr)
        return {"lr": lr, "lr_power": _hyper(opt, "learning_rate_power"),
                "l1": _hyper(opt, "l1_regularization_strength"), "l2": l2,
                "l2_shrinkage": float(shrinkage)}, initial


def _static_update_groups(static):
    """(width, [(gradient, table, its shares)]) for each Sok>StaticApply of a step: the tables
    of one device and width whose gradients take one form (read in place from a pooled
    lookup's output gradient, Sok>PooledGradShares, or given per id; ids lookup_sparse checked
    or not) share one call, which the GPU runs as one sort, one sum and one apply. A table
    named twice goes to another call (one call's tables are distinct)."""
    groups = {}
    for grad, variable in static:
        # A pooled lookup's gradient is read from its output gradient in place: the per-id
        # rows are never written.
        shares = pooled_gradient_shares(grad.values)
        key = (variable.handle.device, _dimension(variable), shares is None,
               indices_are_checked(grad.indices))
        calls = groups.setdefault(key, [])
        call = next((c for c in calls if all(v is not variable for _, v, _ in c)), None)
        if call is None:
            call = []
            calls.append(call)
        call.append((grad, variable, shares))
    return [(key[1], call) for key, calls in groups.items() for call in calls]


def SGD(lr=0.01):  # noqa: N802  (SOK's name)
    """Plain SGD for sok tables: `sok.SGD(lr).apply_gradients(grads_and_vars)` (Keras 2's
    legacy SGD, or Keras 3's SGD where tf.keras is Keras 3)."""
    keras_3 = _versions.tf_keras_is_keras_3()
    return OptimizerWrapper((tf.keras.optimizers if keras_3 else tf.keras.optimizers.legacy).SGD(lr))
