"""Where a dynamic table's train step spends its time on the GPU (T4's shape, 1Mi keys here
to start quickly): Sok>DynamicApply alone with its hyper-parameters already in host memory,
against the same through sok.OptimizerWrapper (hyper computed on the GPU, copied to the host
each step), and the table's find-or-insert alone. Steps run inside one tf.function loop."""
import os
import time

import numpy as np
import tensorflow as tf

import sparse_operation_kit as sok
from sparse_operation_kit import raw_ops

KEYS, DIM, BATCH, LOOP = 1 << 20, 128, 65536, 20


def per_step(step):
    @tf.function
    def run():
        total = tf.constant(0.0)
        for _ in tf.range(LOOP):
            total += step()
        return total
    run().numpy()
    best = []
    for _ in range(5):
        start = time.perf_counter()
        for _ in range(5):
            out = run()
        out.numpy()
        best.append((time.perf_counter() - start) / 5 / LOOP * 1e3)
    return float(np.median(best))


def main():
    sok.init(comm_tool="single")
    rng = np.random.default_rng(1)
    present = rng.integers(-(1 << 62), 1 << 62, size=KEYS)
    with tf.device("GPU:0"):
        table = sok.DynamicVariable(DIM, name="parts", init_capacity=2 * KEYS)
        table.sparse_read(tf.constant(present))
        keys = tf.constant(present[rng.integers(0, KEYS, size=BATCH)])
        grads = tf.ones([BATCH, DIM])
        with tf.device("CPU:0"):
            hyper = tf.constant([1e-9, 0.0])
        wrapper = sok.OptimizerWrapper(tf.keras.optimizers.legacy.SGD(1e-9))
        slices = tf.IndexedSlices(grads, keys)

        def raw_apply():
            raw_ops.sok_dynamic_apply(table.handle, keys, grads, hyper, rule="sgd", state_dim=0)
            return tf.constant(0.0)

        small_keys, small_grads = keys[:4096], grads[:4096]

        def small_apply():
            raw_ops.sok_dynamic_apply(table.handle, small_keys, small_grads, hyper, rule="sgd",
                                      state_dim=0)
            return tf.constant(0.0)

        static = sok.Variable(tf.zeros([KEYS, DIM]), name="parts_static")
        rows = tf.constant(rng.integers(0, KEYS, size=BATCH), tf.int64)

        def static_apply():
            raw_ops.sok_static_apply(tables=[static.handle], slots=[], indices=[rows], grads=[grads],
                                     grad_rows=[], grad_scales=[], hyper=hyper, rule="sgd")
            return tf.constant(0.0)

        def small_static_apply():
            raw_ops.sok_static_apply(tables=[static.handle], slots=[], indices=[rows[:4096]],
                                     grads=[small_grads], grad_rows=[], grad_scales=[],
                                     hyper=hyper, rule="sgd")
            return tf.constant(0.0)

        def wrapped_apply():
            wrapper.apply_gradients([(slices, table)])
            return tf.constant(0.0)

        # Host time to enqueue one apply (eager, no wait), against the same with a wait.
        for _ in range(3):
            raw_apply()
        start = time.perf_counter()
        for _ in range(50):
            raw_apply()
        enqueued = (time.perf_counter() - start) / 50 * 1e3
        float(tf.reduce_sum(table.sparse_read(keys[:4], insert=False)))
        print(f"apply, eager, host enqueue: {enqueued:.3f} ms", flush=True)
        if os.environ.get("PARTS_ONCE"):  # for a kernel profiler: three eager applies
            for _ in range(3):
                raw_apply()
            print(float(tf.reduce_sum(table.sparse_read(keys[:4], insert=False))))
            return
        for name, step in [("apply, hyper in host memory", raw_apply),
                           ("apply of 4096 keys, hyper in host memory", small_apply),
                           ("static apply (Sok>StaticApply), same shape", static_apply),
                           ("static apply of 4096 rows", small_static_apply),
                           ("apply through OptimizerWrapper", wrapped_apply),
                           ("find-or-insert", lambda: tf.reduce_sum(table.sparse_read(keys))),
                           ("find", lambda: tf.reduce_sum(table.sparse_read(keys, insert=False)))]:
            print(f"{name}: {per_step(step):.3f} ms", flush=True)


if __name__ == "__main__":
    main()
