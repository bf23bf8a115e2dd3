"""Where T1's one-id step spends its time on the GPU: the raw Sok>GatherSingleIds op over 26
tables with prepared inputs, against 26 tf.gather, then the same with lookup_sparse's ragged
construction, each a tf.function timed over back-to-back calls."""
import os
import sys

import numpy as np
import tensorflow as tf

import sparse_operation_kit as sok
from sparse_operation_kit import raw_ops

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "gpu"))
from tf_gpu import timed_call  # noqa: E402

sok.init(comm_tool="single")
B, D, T = 65536, 128, 26
rng = np.random.default_rng(0)
with tf.device("GPU:0"):
    tables = [tf.Variable(tf.random.uniform([1 << 20, D])) for _ in range(T)]
    ids = [tf.constant(rng.integers(0, 1 << 20, size=B), tf.int64) for _ in range(T)]


with tf.device("GPU:0"):
    raw = tf.function(lambda: tf.add_n([tf.reduce_sum(o) for o in raw_ops.sok_gather_single_ids(
        tables=[t.handle for t in tables], ids=ids, dtype=tf.float32, dim=D,
        table_names=[str(i) for i in range(T)]).outputs]))
    one = tf.function(lambda: tf.reduce_sum(raw_ops.sok_gather_single_ids(
        tables=[tables[0].handle], ids=ids[:1], dtype=tf.float32, dim=D,
        table_names=["0"]).outputs[0]))
    gather = tf.function(lambda: tf.add_n([tf.reduce_sum(tf.gather(t, i)) for t, i in zip(tables, ids)]))
    gather1 = tf.function(lambda: tf.reduce_sum(tf.gather(tables[0], ids[0])))
    lookup = tf.function(lambda: tf.add_n([tf.reduce_sum(o) for o in sok.lookup_sparse(
        tables, [tf.RaggedTensor.from_tensor(i[:, None]) for i in ids], combiners=["sum"] * T)]))
    ragged_only = tf.function(lambda: tf.add_n([tf.reduce_sum(tf.RaggedTensor.from_tensor(
        i[:, None]).row_splits) for i in ids]))
    for name, fn in [("raw gather_single_ids x26", raw), ("tf.gather x26", gather),
                     ("raw gather_single_ids x1", one), ("tf.gather x1", gather1),
                     ("lookup_sparse one-id x26", lookup), ("from_tensor only x26", ragged_only)]:
        print(f"{name}: {timed_call(fn, 50):.3f} ms", flush=True)
