"""C5: fused dot interaction forward+backward vs the same interaction from TF ops (batched
matmul + lower-triangle gather), batch 8192, 27 vectors of 128, tf.function, same process."""
import os
import sys

import numpy as np
import tensorflow as tf

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import common  # noqa: E402

import sparse_operation_kit as sok  # noqa: E402
from sparse_operation_kit.interaction import dot_interaction_reference  # noqa: E402


def timed_step(interaction):
    @tf.function
    def step(features, cotangent):
        with tf.GradientTape() as tape:
            tape.watch(features)
            loss = tf.reduce_sum(interaction(features) * cotangent)
        return tape.gradient(loss, features)
    return step


def main():
    args = common.int_options(__doc__, batch=8192, iterations=20)
    features = tf.constant(np.random.default_rng(0).normal(size=[args.batch, 27, 128]),
                           tf.float32)
    cotangent = tf.ones([args.batch, 128 + 27 * 26 // 2])
    sok_step, tf_step = timed_step(sok.dot_interaction), timed_step(dot_interaction_reference)
    sok_ms, tf_ms = common.interleaved_median_ms(
        [lambda: sok_step(features, cotangent).numpy(), lambda: tf_step(features, cotangent).numpy()],
        iterations=args.iterations)
    common.report_comparisons("c5_interaction", {
        "benchmark": "C5 dot interaction forward+backward vs TF ops",
        "config": {"batch": args.batch, "features": 27, "dim": 128,
                   "iterations": args.iterations},
        "results": {"C5_interaction": common.comparison(sok_ms, "tf", tf_ms, target=">= 2x")}},
        "tf")


if __name__ == "__main__":
    main()
