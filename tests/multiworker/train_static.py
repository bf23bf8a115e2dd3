"""Run under `horovodrun -np N --gloo`: static distributed and localized tables trained with
sok on unequal local batches must equal one tf.Variable model trained on the global batch.

Every worker builds the same global data from a fixed seed, trains its slice through sok,
trains the single-worker reference on the whole batch itself, and checks its local shards.
Prints "PASS rank=<r>" on success; exits non-zero on a mismatch.
"""
import argparse

import horovod.tensorflow as hvd
import numpy as np
import tensorflow as tf

import sparse_operation_kit as sok
from verdict import (KERAS_3, keras_optimizer, placement_failures, report, start_worker,
                     summed_duplicates)

# (rows, dim, mode): two tables of dim 8 (one distributed, one localized) fused in one group,
# and a dim-4 table localized on the last worker.
TABLES = [(37, 8, "distributed"), (11, 8, "localized:0"), (23, 4, "localized:{last}")]
LOOKUP_TABLES = [0, 1, 2, 0]  # table 0 is looked up twice
COMBINERS = ["sum", "mean", "sqrtn", "mean"]
GLOBAL_BATCH = 24


def optimizer(name):
    if name == "sgd_momentum":
        return keras_optimizer("SGD", 0.05, momentum=0.9)
    if name == "adam":
        return keras_optimizer("Adam", 0.01)
    return keras_optimizer("Adagrad", 0.1)


class LazyAdamReference:
    """Keras Adam on the rows a step's gradients touch (what sok.OptimizerWrapper does to
    static tables), in NumPy float64: lr_t = lr sqrt(1 - b2^t) / (1 - b1^t);
    m = b1 m + (1 - b1) g; v = b2 v + (1 - b2) g^2; w -= lr_t m / (sqrt(v) + eps)."""

    def __init__(self, lr=0.01, beta1=0.9, beta2=0.999, epsilon=1e-7):
        self.lr, self.beta1, self.beta2, self.epsilon = lr, beta1, beta2, epsilon
        self.step, self.moments = 0, {}

    def apply(self, grads_and_tables):
        self.step += 1
        lr_t = self.lr * np.sqrt(1 - self.beta2 ** self.step) / (1 - self.beta1 ** self.step)
        for grad, table in grads_and_tables:
            m, v = self.moments.setdefault(id(table), ({}, {}))
            dense = tf.convert_to_tensor(grad).numpy().astype(np.float64)
            values = table.numpy()
            for row in np.unique(grad.indices.numpy()):
                m[row] = self.beta1 * m.get(row, 0.0) + (1 - self.beta1) * dense[row]
                v[row] = self.beta2 * v.get(row, 0.0) + (1 - self.beta2) * dense[row] ** 2
                values[row] -= lr_t * m[row] / (np.sqrt(v[row]) + self.epsilon)
            table.assign(values)


def local_slices(num_workers, step):
    """Unequal local batches; on step 2 the last worker gets no samples at all."""
    weights = np.arange(1, num_workers + 1, dtype=np.float64) ** 2
    if step == 2:
        weights[-1] = 0
    sizes = np.floor(weights / weights.sum() * GLOBAL_BATCH).astype(int)
    sizes[0] += GLOBAL_BATCH - sizes.sum()
    return np.concatenate([[0], np.cumsum(sizes)])


def global_batch(rng):
    """Per lookup: (row lengths, ids, weights); plus the regression targets."""
    lookups = []
    for table in LOOKUP_TABLES:
        lengths = rng.integers(0, 4, size=GLOBAL_BATCH)
        ids = rng.integers(0, TABLES[table][0], size=lengths.sum())
        weights = rng.uniform(0.5, 1.5, size=lengths.sum()).astype(np.float32)
        lookups.append((lengths, ids, weights))
    targets = rng.normal(size=[GLOBAL_BATCH, 1]).astype(np.float32)
    return lookups, targets


def ragged_slice(lengths, values, begin, end, dtype):
    starts = np.concatenate([[0], np.cumsum(lengths)])
    return tf.RaggedTensor.from_row_lengths(
        tf.constant(values[starts[begin]:starts[end]], dtype), tf.constant(lengths[begin:end], tf.int64))


def slice_inputs(lookups, begin, end):
    """Ragged ids and weights of samples [begin, end); lookup 1 has no weights."""
    ids = [ragged_slice(l, i, begin, end, tf.int64) for l, i, _ in lookups]
    weights = [ragged_slice(l, w, begin, end, tf.float32) for l, _, w in lookups]
    weights[1] = None
    return ids, weights


def predict(tables, dense, ids, weights, lookup_fn):
    outputs = lookup_fn([tables[t] for t in LOOKUP_TABLES], ids, weights)
    return tf.matmul(tf.cast(tf.concat(outputs, axis=1), tf.float32), dense)


def sok_lookup(tables, ids, weights, compress=False):
    return sok.lookup_sparse(tables, ids, weights, COMBINERS, compress=compress)


def reference_lookup(tables, ids, weights):
    """Sum / mean / sqrtn of weighted rows from TF ops, touching only the rows used, pooled
    in float32 and rounded to the table's dtype (as sok pools 16-bit tables)."""
    outputs = []
    for table, sample_ids, sample_weights, combiner in zip(tables, ids, weights, COMBINERS):
        if sample_weights is None:
            sample_weights = tf.ones_like(sample_ids, tf.float32)
        rows = tf.cast(tf.gather(table, sample_ids), tf.float32) * tf.expand_dims(
            sample_weights, -1)
        pooled = tf.reduce_sum(rows, axis=1)
        if combiner == "mean":
            pooled = tf.math.divide_no_nan(pooled, tf.reduce_sum(sample_weights, 1, keepdims=True))
        elif combiner == "sqrtn":
            pooled = tf.math.divide_no_nan(
                pooled, tf.sqrt(tf.reduce_sum(sample_weights ** 2, 1, keepdims=True)))
        outputs.append(tf.cast(pooled, table.dtype))
    return outputs


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--optimizer", default="sgd_momentum")
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--function", action="store_true")
    parser.add_argument("--compress", action="store_true",
                        help="float16 all-to-all: equal to the reference within float16 rounding")
    parser.add_argument("--table_dtype", default="float32",
                        help="float16 / bfloat16: 16-bit tables on both sides, equal within "
                             "their rounding")
    args = parser.parse_args()

    start_worker(hvd, sok)
    rank, num_workers = hvd.rank(), hvd.size()
    rng = np.random.default_rng(2024)
    inits = [rng.normal(size=[rows, dim]).astype(np.float32) for rows, dim, _ in TABLES]
    dense_init = rng.normal(size=[8 + 8 + 4 + 8, 1]).astype(np.float32)
    modes = [mode.format(last=num_workers - 1) for _, _, mode in TABLES]

    dtype = tf.as_dtype(args.table_dtype)
    tables = [sok.Variable(tf.cast(init, dtype), mode=mode, name=f"table{t}", dtype=dtype)
              for t, (init, mode) in enumerate(zip(inits, modes))]
    dense = tf.Variable(dense_init)
    ref_tables = [tf.Variable(tf.cast(init, dtype)) for init in inits]
    ref_dense = tf.Variable(dense_init)
    opt, ref_opt = optimizer(args.optimizer), optimizer(args.optimizer)
    # Adam through the wrapper updates the static tables lazily (Sok>StaticApply); the
    # reference does so in NumPy, the dense layer through Keras on both sides.
    lazy_reference = LazyAdamReference() if args.optimizer == "adam" else None
    # Under Keras 3 through the wrapper too: Keras 3 applies the repeated ids the exchange
    # leaves in a worker's gradient row by row; the wrapper sums them, as the reference is.
    if lazy_reference or KERAS_3:
        opt = sok.OptimizerWrapper(opt)

    def train_step(ids, weights, targets):
        with tf.GradientTape() as tape:
            pred = predict(tables, dense, ids, weights,
                           lambda *a: sok_lookup(*a, compress=args.compress))
            # Each worker's share of the global mean loss: gradients add up across workers.
            loss = tf.reduce_sum((pred - targets) ** 2) / GLOBAL_BATCH
        grads = tape.gradient(loss, tables + [dense])
        dense_grad = sok.communication.allreduce_sum(grads[-1])
        opt.apply_gradients(zip(grads[:-1] + [dense_grad], tables + [dense]))

    def reference_step(lookups, targets):
        with tf.GradientTape() as tape:
            pred = predict(ref_tables, ref_dense, *slice_inputs(lookups, 0, GLOBAL_BATCH),
                           reference_lookup)
            loss = tf.reduce_sum((pred - targets) ** 2) / GLOBAL_BATCH
        grads = tape.gradient(loss, ref_tables + [ref_dense])
        if lazy_reference:
            lazy_reference.apply(zip(grads[:-1], ref_tables))
            ref_opt.apply_gradients([(grads[-1], ref_dense)])
        else:
            ref_opt.apply_gradients(zip(map(summed_duplicates, grads), ref_tables + [ref_dense]))

    if args.function:
        train_step = tf.function(train_step)
    for step in range(args.steps):
        lookups, targets = global_batch(rng)
        bounds = local_slices(num_workers, step)
        begin, end = int(bounds[rank]), int(bounds[rank + 1])
        train_step(*slice_inputs(lookups, begin, end), tf.constant(targets[begin:end]))
        reference_step(lookups, tf.constant(targets))

    failures = placement_failures(sok, tables)
    # float16 exchanges round each vector and gradient once (relative 2^-11) per step.
    # 16-bit tables: each update rounds once on both sides, not always alike.
    rounded = args.compress or dtype != tf.float32
    rtol, atol = {tf.bfloat16: (5e-2, 1e-2)}.get(dtype, (1e-2, 1e-3)) if rounded else (1e-5, 1e-6)
    deviation = 0.0
    for t, (table, ref) in enumerate(zip(tables, ref_tables)):
        expected = ref.numpy().astype(np.float32)[table.global_row_ids()]
        value = table.numpy().astype(np.float32)
        if table.dtype != dtype:
            failures.append(f"table {t} is {table.dtype.name}, not {dtype.name}")
        if table.shape != expected.shape or not np.allclose(value, expected, rtol=rtol,
                                                            atol=atol):
            failures.append(f"table {t} ({table.mode}) differs from the reference")
        elif expected.size:
            deviation = max(deviation, float(np.max(np.abs(value - expected))))
        if np.allclose(ref.numpy().astype(np.float32), inits[t], rtol=1e-2, atol=1e-2):
            failures.append(f"table {t} did not train")
    if not np.allclose(dense.numpy(), ref_dense.numpy(), rtol=rtol, atol=atol):
        failures.append("dense layer differs from the reference")
    deviation = max(deviation, float(np.max(np.abs(dense.numpy() - ref_dense.numpy()))))
    if args.compress and deviation == 0.0:
        failures.append("--compress changed nothing: the all-to-all did not carry float16")
    report(rank, failures)


if __name__ == "__main__":
    main()
