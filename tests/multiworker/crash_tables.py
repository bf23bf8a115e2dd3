"""Tables for the interrupted-dump tests: two dynamic and two static tables with Adagrad
state, every row and state value set to one number per dump, so a load shows which dump (or
mixture of dumps) it restored."""
import numpy as np
import tensorflow as tf

import sparse_operation_kit as sok
from sparse_operation_kit._ops import raw_ops

try:  # a worker's module: its folder, not tests/, is on sys.path
    from verdict import keras_optimizer
except ImportError:  # the suite's multiworker.crash_tables
    from keras_optimizers import keras_optimizer

DIM = 4


def make_tables(keys):
    """The four tables (the same names in every process) and their wrapped optimizer, with
    Adagrad's slots made by one step."""
    tables = [sok.DynamicVariable(DIM, name=f"crash_dynamic_{i}", initializer="zeros")
              for i in range(2)]
    tables += [sok.Variable(np.zeros([keys, DIM], np.float32), name=f"crash_static_{i}")
               for i in range(2)]
    optimizer = sok.OptimizerWrapper(keras_optimizer("Adagrad", 0.1))
    ids = [tf.ragged.constant([[0, 1]], tf.int64)] * len(tables)
    with tf.GradientTape() as tape:
        loss = sum(tf.reduce_sum(o) for o in sok.lookup_sparse(tables, ids))
    optimizer.apply_gradients(zip(tape.gradient(loss, tables), tables))
    return tables, optimizer


def fill(tables, optimizer, keys, value):
    """Rows `value` and accumulators `value + 0.5` for keys [0, keys) this worker owns."""
    for table in tables:
        if isinstance(table, sok.DynamicVariable):
            mine = np.arange(keys, dtype=np.int64)
            mine = mine[table.owns(mine)]
            rows = np.full([len(mine), DIM], value, np.float32)
            raw_ops.sok_dynamic_table_import(table.handle, mine, rows, rows + 0.5)
        else:
            table.assign(np.full(table.shape, value, np.float32))
            optimizer.get_slot(table, "accumulator").assign(
                np.full(table.shape, value + 0.5, np.float32))


def values_held(tables, optimizer):
    """{(table, "rows" / "state"): the distinct values held}."""
    held = {}
    for table in tables:
        if isinstance(table, sok.DynamicVariable):
            _, rows, state = (t.numpy() for t in raw_ops.sok_dynamic_table_export(table.handle))
        else:
            rows = table.numpy()
            state = optimizer.get_slot(table, "accumulator").numpy()
        held[(table.name, "rows")] = set(np.unique(rows).tolist())
        held[(table.name, "state")] = set(np.unique(state).tolist())
    return held


def count_dump_steps(setattr_, step_to_die, die):
    """Counts a dump's file-system steps (file writes, renames, removals) and calls
    die(step name) at the one numbered `step_to_die`, after half of the file when the step
    writes one. Returns the counter ([steps so far])."""
    import os  # noqa: PLC0415

    from sparse_operation_kit import checkpoint  # noqa: PLC0415

    steps = [0]
    write_file, replace, remove = checkpoint._write_file, os.replace, os.remove

    def step(name):
        steps[0] += 1
        return steps[0] == step_to_die

    def write(path, *args):
        facts = write_file(path, *args)
        if step(path):
            with open(path, "r+b") as handle:
                handle.truncate(facts["bytes"] // 2)
            die(path)
        return facts

    def replace_(source, target, **kwargs):
        if step(target):
            die(target)
        return replace(source, target, **kwargs)

    def remove_(path, **kwargs):
        if step(path):
            die(path)
        return remove(path, **kwargs)

    setattr_(checkpoint, "_write_file", write)
    setattr_(os, "replace", replace_)
    setattr_(os, "remove", remove_)
    return steps
