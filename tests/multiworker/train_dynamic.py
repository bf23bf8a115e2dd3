"""Run under `horovodrun -np N --gloo`: dynamic tables (distributed and localized) trained
through sok.OptimizerWrapper on unequal local batches must equal a single-worker tf.Variable
model over the same keys trained on the global batch; `sok.export` on each worker must return
exactly the keys it owns.

Prints "PASS rank=<r>" on success; exits non-zero on a mismatch.
"""
import argparse

import horovod.tensorflow as hvd
import numpy as np
import tensorflow as tf

import sparse_operation_kit as sok
from verdict import (KERAS_3, LazyMomentum, keras_optimizer, placement_failures, report,
                     start_worker, summed_duplicates)

DIM = 6
UNIVERSE = 40
GLOBAL_BATCH = 20
MODES = ["distributed", "localized:{last}"]


def optimizer(name):
    if name == "sgd_momentum":
        return keras_optimizer("SGD", 0.05, momentum=0.9)
    return keras_optimizer("Adagrad", 0.1)


def local_bounds(num_workers, step):
    """Unequal local batches; on step 1 every worker but the first has no samples at all."""
    share = 0 if step == 1 else 7
    sizes = [GLOBAL_BATCH - share * (num_workers - 1)] + [share] * (num_workers - 1)
    return np.concatenate([[0], np.cumsum(sizes)])


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--optimizer", default="sgd_momentum")
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--function", action="store_true")
    args = parser.parse_args()

    start_worker(hvd, sok)
    rank, num_workers = hvd.rank(), hvd.size()
    rng = np.random.default_rng(77)
    universes = [rng.integers(-(1 << 62), 1 << 62, size=UNIVERSE) for _ in MODES]
    modes = [m.format(last=num_workers - 1) for m in MODES]
    tables = [sok.DynamicVariable(DIM, name=f"dyn{t}", mode=mode) for t, mode in enumerate(modes)]
    # The reference's initial rows: a key's initial row depends only on (name, key).
    probes = [sok.DynamicVariable(DIM, name=f"dyn{t}", mode=f"localized:{rank}")
              for t in range(len(MODES))]
    ref_tables = [tf.Variable(p.sparse_read(tf.constant(u)).numpy()) for p, u in zip(probes, universes)]
    wrapper = sok.OptimizerWrapper(optimizer(args.optimizer))
    ref_opt = optimizer(args.optimizer)
    lazy = None  # Keras 3's momentum moves every row: the wrapper's lazy rule, one per table
    if KERAS_3 and args.optimizer == "sgd_momentum":
        lazy = [LazyMomentum(ref_opt) for _ in ref_tables]

    def train_step(ids):
        with tf.GradientTape() as tape:
            outs = sok.lookup_sparse(tables, ids, combiners=["sum", "mean"])
            loss = tf.add_n([tf.reduce_sum(o * o) for o in outs]) / GLOBAL_BATCH
        wrapper.apply_gradients(zip(tape.gradient(loss, tables), tables))

    def reference_step(ids):
        with tf.GradientTape() as tape:
            sums = [tf.reduce_sum(tf.gather(t, i), axis=1) for t, i in zip(ref_tables, ids)]
            counts = tf.cast(tf.expand_dims(ids[1].row_lengths(), 1), tf.float32)
            outs = [sums[0], tf.math.divide_no_nan(sums[1], counts)]
            loss = tf.add_n([tf.reduce_sum(o * o) for o in outs]) / GLOBAL_BATCH
        grads = tape.gradient(loss, ref_tables)
        if lazy:
            for rule, grad, table in zip(lazy, grads, ref_tables):
                rows = np.unique(grad.indices.numpy())
                rule.apply(table, rows, tf.convert_to_tensor(grad).numpy().astype(np.float64)[rows])
        else:
            ref_opt.apply_gradients([(summed_duplicates(g), t) for g, t in zip(grads, ref_tables)])

    if args.function:
        train_step = tf.function(train_step)
    touched = [set() for _ in MODES]
    for step in range(args.steps):
        lengths = [rng.integers(0, 4, size=GLOBAL_BATCH) for _ in MODES]
        rows = [rng.integers(0, UNIVERSE, size=l.sum()) for l in lengths]
        bounds = local_bounds(num_workers, step)
        begin, end = int(bounds[rank]), int(bounds[rank + 1])
        local_ids = []
        for l, r, u in zip(lengths, rows, universes):
            starts = np.concatenate([[0], np.cumsum(l)])
            local_ids.append(tf.RaggedTensor.from_row_lengths(
                tf.constant(u[r[starts[begin]:starts[end]]]), tf.constant(l[begin:end], tf.int64)))
        train_step(local_ids)
        reference_step([tf.RaggedTensor.from_row_lengths(tf.constant(r, tf.int64), l)
                        for l, r in zip(lengths, rows)])
        for t, (u, r) in enumerate(zip(universes, rows)):
            touched[t].update(u[r].tolist())

    failures = placement_failures(sok, tables)
    for t, (table, ref, universe) in enumerate(zip(tables, ref_tables, universes)):
        keys, values = sok.export(table)
        keys, values = keys.numpy(), values.numpy()
        if not table.owns(keys).all():
            failures.append(f"table {t} exports keys it does not own")
        counts = hvd.allgather(tf.constant([len(keys)])).numpy()
        owned = {k for k in touched[t] if table.owns(np.array([k]))[0]}
        if set(keys.tolist()) != owned:
            failures.append(f"table {t} holds {len(keys)} keys, expected the {len(owned)} it owns")
        if counts.sum() != len(touched[t]):
            failures.append(f"table {t}: workers hold {counts.tolist()} keys, {len(touched[t])} were used")
        row_of = {k: i for i, k in enumerate(universe.tolist())}
        expected = ref.numpy()[[row_of[k] for k in keys.tolist()]] if len(keys) else values
        if not np.allclose(values, expected, rtol=1e-5, atol=1e-6):
            failures.append(f"table {t} ({table.mode}) differs from the reference by "
                            f"{np.abs(values - expected).max()}")
    report(rank, failures)


if __name__ == "__main__":
    main()
