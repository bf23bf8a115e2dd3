"""Where a train step's GPU time goes (diagnosis, not a benchmark of record): one workload's
step (T1, T3 or G1b of tf_gpu.py / tf_gpu_dynamic.py, static G1b too) is timed as 10 steps in
one tf.function, then PROFILE_STEPS more steps run between cuProfilerStart / cuProfilerStop so
that `ncu --profile-from-start off --metrics gpu__time_duration.sum --csv` lists the kernels
of those steps only. `summarize` turns that CSV into kernel time per step by kernel name,
against the step's wall time (the difference is launch and host-wait time).

    python3 tf_gpu_kernel_profile.py WORKLOAD              # wall time only
    ncu ... python3 tf_gpu_kernel_profile.py WORKLOAD > x.csv
    python3 tf_gpu_kernel_profile.py summarize x.csv WALL_MS
"""
import collections
import csv
import ctypes
import io
import os
import sys

import numpy as np

PROFILE_STEPS = 3


def profiler(start):
    """cuProfilerStart / Stop in TensorFlow's (primary) context of GPU 0."""
    cuda = ctypes.CDLL("libcuda.so.1")
    context = ctypes.c_void_p()
    if cuda.cuDevicePrimaryCtxRetain(ctypes.byref(context), 0) == 0:
        cuda.cuCtxSetCurrent(context)
    (cuda.cuProfilerStart if start else cuda.cuProfilerStop)()


def workload(name):
    """A train step (a no-argument function returning the loss) of the named workload."""
    import tensorflow as tf
    import sparse_operation_kit as sok
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from tf_gpu import BATCH, CRITEO_TB, DIM, zipf_ids
    sok.init(comm_tool="single")
    rng = np.random.default_rng(12)
    optimizer = sok.OptimizerWrapper(tf.keras.optimizers.legacy.SGD(0.01))
    if name == "t1":
        vocabs = [min(v, 4_000_000) for v in CRITEO_TB]
        tables = [sok.Variable(tf.random.stateless_uniform([v, DIM], [1, i], -0.05, 0.05))
                  for i, v in enumerate(vocabs)]
        ones = tf.ones([BATCH], tf.int64)
        inputs = [tf.RaggedTensor.from_row_lengths(
            tf.constant(zipf_ids(rng, v, BATCH), tf.int64), ones) for v in vocabs]
    elif name in ("t3", "g1b_static"):
        rows, batch = 8 << 20, BATCH if name == "t3" else 1 << 20
        tables = [sok.Variable(tf.random.stateless_uniform([rows, DIM], [3, 0], -0.05, 0.05))]
        inputs = [tf.RaggedTensor.from_tensor(
            tf.constant(rng.integers(0, rows, size=batch), tf.int64)[:, None])]
    elif name == "g1b":
        keys = 8 << 20
        present = rng.integers(-(1 << 62), 1 << 62, size=keys)
        table = sok.DynamicVariable(DIM, name="g1b", init_capacity=keys + (keys >> 3))
        for start in range(0, keys, 1 << 20):
            table.sparse_read(tf.constant(present[start:start + (1 << 20)]))
        tables = [table]
        inputs = [tf.RaggedTensor.from_tensor(
            tf.constant(present[rng.integers(0, keys, size=1 << 20)])[:, None])]
    else:
        sys.exit(f"unknown workload {name!r}: t1, t3, g1b, g1b_static")

    def step():
        with tf.GradientTape() as tape:
            outputs = sok.lookup_sparse(tables, inputs, combiners=["sum"] * len(tables))
            loss = tf.add_n([tf.reduce_sum(o) for o in outputs])
        optimizer.apply_gradients(zip(tape.gradient(loss, tables), tables))
        return loss
    return step


def run(name):
    import tensorflow as tf
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from tf_gpu import looped, timed
    with tf.device("GPU:0"):
        step = workload(name)
        call, loop = tf.function(step), looped(step, 10)
        call_ms = min(timed(call, 10) for _ in range(3))
        loop_ms = min(timed(loop, 2) for _ in range(3)) / 10
        print(f"# {name}: call {call_ms:.3f} ms, loop {loop_ms:.3f} ms a step", file=sys.stderr,
              flush=True)
        profiler(True)
        for _ in range(PROFILE_STEPS):
            result = call()
        result.numpy()
        profiler(False)


def summarize(path, wall_ms):
    """Kernel time per step by kernel name, from ncu's CSV (gpu__time_duration.sum in ns)."""
    text = open(path).read()
    text = text[text.index('"ID"'):] if '"ID"' in text else text
    totals, counts = collections.Counter(), collections.Counter()
    for row in csv.DictReader(io.StringIO(text)):
        if row.get("Metric Name") != "gpu__time_duration.sum":
            continue
        value = float(row["Metric Value"].replace(",", ""))
        scale = {"nsecond": 1e-6, "ns": 1e-6, "usecond": 1e-3, "us": 1e-3,
                 "msecond": 1.0, "ms": 1.0}.get(row["Metric Unit"], 1e-6)
        kernel = row["Kernel Name"].split("(")[0][:90]
        totals[kernel] += value * scale / PROFILE_STEPS
        counts[kernel] += 1 / PROFILE_STEPS
    busy = sum(totals.values())
    print(f"kernels {busy:.3f} ms a step ({sum(counts.values()):.0f} launches), wall {wall_ms} ms")
    for kernel, ms in totals.most_common(25):
        print(f"  {ms:8.4f} ms  {counts[kernel]:5.1f}x  {kernel}")


if __name__ == "__main__":
    if sys.argv[1] == "summarize":
        summarize(sys.argv[2], sys.argv[3] if len(sys.argv) > 3 else "?")
    else:
        run(sys.argv[1])
