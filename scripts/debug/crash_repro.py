"""Reproduces the out-of-range crash of Sok>PartitionKeys' CPU kernel on the GPU build of TF."""
import sys

import tensorflow as tf

import sparse_operation_kit as sok
from sparse_operation_kit import raw_ops

sok.init(comm_tool="single")
variant = sys.argv[1]
print("variant", variant, flush=True)
with tf.device("CPU:0"):
    ids = tf.constant([1, 10, 2], tf.int64)
    try:
        if variant == "raw":
            out = raw_ops.sok_partition_keys(ids=[ids], lookup_table=[0], table_rows=[10],
                                             table_owner=[-1], table_names=["t"], num_workers=1)
        elif variant == "raw_ok":
            out = raw_ops.sok_partition_keys(ids=[ids], lookup_table=[0], table_rows=[100],
                                             table_owner=[-1], table_names=["t"], num_workers=1)
        elif variant == "combine_bad":
            out = raw_ops.sok_combine_forward(rows=tf.zeros([5, 2]),
                                              position=tf.constant([0, 7, 2], tf.uint32),
                                              row_splits=[tf.constant([0, 2, 3], tf.int64)],
                                              weights=[tf.zeros([0])], combiners=["sum"])
        print("result", out, flush=True)
    except tf.errors.InvalidArgumentError as error:
        print("raised:", str(error)[:200], flush=True)
