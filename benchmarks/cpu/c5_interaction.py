"""C5: fused dot interaction forward+backward vs the same interaction from TF ops (batched
matmul + lower-triangle gather), batch 8192, 27 vectors of 128, tf.function, same process."""
import argparse
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
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--batch", type=int, default=8192)
    parser.add_argument("--iterations", type=int, default=20)
    args = parser.parse_args()
    features = tf.constant(np.random.default_rng(0).normal(size=[args.batch, 27, 128]),
                           tf.float32)
    cotangent = tf.ones([args.batch, 128 + 27 * 26 // 2])
    sok_step, tf_step = timed_step(sok.dot_interaction), timed_step(dot_interaction_reference)
    sok_ms, tf_ms = common.interleaved_median_ms(
        [lambda: sok_step(features, cotangent).numpy(), lambda: tf_step(features, cotangent).numpy()],
        iterations=args.iterations)
    result = {"sok_ms": round(sok_ms, 3), "tf_ms": round(tf_ms, 3),
              "speedup": round(tf_ms / sok_ms, 3), "target": ">= 2x"}
    path = common.write_result("c5_interaction", {
        "benchmark": "C5 dot interaction forward+backward vs TF ops",
        "config": {"batch": args.batch, "features": 27, "dim": 128,
                   "iterations": args.iterations},
        "results": {"C5_interaction": result}})
    print(common.markdown_table(["benchmark", "sok ms", "TF ms", "speedup"],
                                [["C5_interaction", result["sok_ms"], result["tf_ms"],
                                  f"{result['speedup']:.2f}x"]]))
    print(f"written to {path}")


if __name__ == "__main__":
    main()
