"""Probe (diagnosis, not a benchmark of record): what a train step pays when part of it runs on
the host. Plain TensorFlow's T3 step (tf.nn.embedding_lookup of one 8Mi x 128 table, batch
65,536, legacy SGD) timed per call and 10 per call, as is (every op on the GPU) and with the
optimizer's hyper-parameters and step counter made in host memory (the function then spans two
devices: its CPU part runs separately and the learning rate crosses to the GPU each step).

    python3 probe_host_hypers.py
"""
import os
import sys

import numpy as np
import tensorflow as tf

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "gpu"))
from tf_gpu import BATCH, DIM, looped, timed_call  # noqa: E402


def t3_step(hypers_on_host):
    rng = np.random.default_rng(3)
    table = tf.Variable(tf.random.stateless_uniform([8 << 20, DIM], [3, 0], -0.05, 0.05))
    ids = tf.constant(rng.integers(0, 8 << 20, size=BATCH), tf.int64)
    optimizer = tf.keras.optimizers.legacy.SGD(0.01)
    if hypers_on_host:
        with tf.device("CPU:0"):
            optimizer._create_hypers()
            optimizer.iterations  # noqa: B018

    def step():
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(tf.nn.embedding_lookup(table, ids))
        optimizer.apply_gradients([(tape.gradient(loss, table), table)])
        return loss
    return step


def main():
    with tf.device("GPU:0"):
        steps = {"gpu": t3_step(False), "host_hypers": t3_step(True)}
        fns = {}
        for name, step in steps.items():
            fns[name + "_call"] = tf.function(step)
            fns[name + "_loop"] = looped(step, 10)
        for fn in fns.values():
            fn().numpy()
        samples = {name: [] for name in fns}
        for _ in range(5):
            for name, fn in fns.items():
                samples[name].append(timed_call(fn, 20) / (10 if name.endswith("_loop") else 1))
    for name, values in samples.items():
        print(f"{name:18s} {np.median(values):.3f} ms a step")


if __name__ == "__main__":
    main()
