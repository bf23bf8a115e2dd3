"""Run under `horovodrun -np 2 --gloo`, as SOK's localized dump/load test does it: per
optimizer, unnamed dynamic tables made in a loop, one per worker ("localized:<rank>"), one
training step, sok.dump to one folder (argv[1]) shared by every optimizer, rows and slots
zeroed, sok.load; each worker then holds what it held before the dump. Worker 1 makes an
unnamed table first, so the two workers' automatic names differ."""
import sys

import horovod.tensorflow as hvd
import numpy as np
import tensorflow as tf

import sparse_operation_kit as sok
from verdict import keras_optimizer, start_worker

start_worker(hvd, sok)  # one GPU a worker where there are GPUs, as SOK's examples pin them
rank, workers = hvd.rank(), hvd.size()
if rank == 1:
    sok.DynamicVariable(dimension=2)  # only here: the automatic names no longer agree
dims = [16 - 4 * i for i in range(workers)]
optimizers = [keras_optimizer("SGD", 1.0), keras_optimizer("SGD", 1.0, momentum=0.9),
              keras_optimizer("Adagrad", 1.0), keras_optimizer("Ftrl", 1.0)]
rng = np.random.default_rng(3)
for number, optimizer in enumerate(optimizers):
    wrapper = sok.OptimizerWrapper(optimizer)
    tables = [sok.DynamicVariable(dimension=dim, initializer=str(3 + i), var_type="hbm",
                                  mode=f"localized:{i}") for i, dim in enumerate(dims)]
    ids = [tf.RaggedTensor.from_row_lengths(rng.integers(0, 500, 64), [2] * 32) for _ in dims]
    with tf.GradientTape() as tape:
        loss = sum(tf.reduce_sum(e) for e in sok.lookup_sparse(tables, ids,
                                                             combiners=["sum"] * len(dims)))
    wrapper.apply_gradients(zip(tape.gradient(loss, tables), tables))
    slot_names = wrapper.get_slot_names() if number else []

    def held():
        out = []
        for table in tables:
            keys, rows = sok.export(table)
            order = np.argsort(keys.numpy())
            out.append((keys.numpy()[order], rows.numpy()[order]))
            for name in slot_names:
                slot_keys, slot_rows = sok.export(wrapper.get_slot(table, name))
                slot_order = np.argsort(np.asarray(slot_keys))
                out.append((np.asarray(slot_keys)[slot_order], np.asarray(slot_rows)[slot_order]))
        return out

    before = held()
    assert sum(len(k) for k, _ in before[::1 + len(slot_names)]) > 0
    sok.dump(sys.argv[1], tables, wrapper)
    for table in tables:
        keys, rows = sok.export(table)
        sok.assign(table, keys, tf.zeros_like(rows))
        for name in slot_names:
            slot = wrapper.get_slot(table, name)
            slot_keys, slot_rows = sok.export(slot)
            sok.assign(slot, slot_keys, np.zeros_like(np.asarray(slot_rows)))
    sok.load(sys.argv[1], tables, wrapper)
    for (keys, rows), (keys_after, rows_after) in zip(before, held()):
        np.testing.assert_array_equal(keys, keys_after)
        np.testing.assert_array_equal(rows, rows_after)
    print(f"OPTIMIZER {number} rank={rank} tables={[t.name for t in tables]}", flush=True)
print(f"PASS rank={rank}", flush=True)
