"""The fused sparse optimizer rules by name (kit_src/core/optimizers/rule_table.h, handed over
by Sok>OptimizerRules): each rule's hyper-parameters in the order Sok>DynamicApply and
Sok>StaticApply take them, and the Keras slot of each [dim] section of its state. `hyper_vector`
packs a step's values by name, so neither side depends on positions written twice."""
import functools
import json

import tensorflow as tf

from sparse_operation_kit._ops import raw_ops


@functools.lru_cache(maxsize=None)
def rule_table():
    """{rule: {"hyper": [names], "slots": [names], "last_slot_if": name or None}}."""
    # Read eagerly (also while a tf.function is traced), on the CPU whatever device the caller
    # is placing ops on: the op has a CPU kernel only.
    with tf.init_scope(), tf.device("CPU:0"):
        return json.loads(raw_ops.sok_optimizer_rules().numpy().decode())


def _spec(rule):
    table = rule_table()
    if rule not in table:
        raise ValueError(f"unknown optimizer rule '{rule}'; the rules are {sorted(table)}")
    return table[rule]


def hyper_vector(rule, **values):
    """The rule's `hyper` input: `values` (one a hyper-parameter, by the table's names) as a
    float32 vector in the table's order."""
    names = _spec(rule)["hyper"]
    missing = [name for name in names if name not in values]
    unknown = sorted(set(values) - set(names))
    if missing or unknown:
        raise ValueError(f"{rule} takes the hyper-parameters {names}; missing {missing}, "
                         f"unknown {unknown}")
    return tf.stack([tf.cast(values[name], tf.float32) for name in names])


def slot_names(rule, keep_last=True):
    """The Keras slot of each [dim] section of the rule's state, in storage order; without
    `keep_last`, less the last slot the table keeps only when `last_slot_if` is non-zero."""
    spec = _spec(rule)
    slots = list(spec["slots"])
    if spec["last_slot_if"] is not None and not keep_last:
        slots.pop()
    return slots
