"""A/B (diagnosis): T3 / T1 train steps of tf_gpu_kernel_profile.py with the fused updates'
hypers on the tables' GPU (the wrapper's choice) against on the host (a two-device step, as
before), interleaved in one process. python3 ab_hyper_device.py"""
import os
import sys

import numpy as np
import tensorflow as tf

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import sparse_operation_kit.optimizer as sok_optimizer  # noqa: E402
from tf_gpu import looped, timed  # noqa: E402
from tf_gpu_kernel_profile import workload  # noqa: E402

chosen = sok_optimizer._hyper_device


def main():
    fns = {}
    with tf.device("GPU:0"):
        for name in ("t3", "t1"):
            for where in ("gpu", "host"):
                sok_optimizer._hyper_device = (chosen if where == "gpu"
                                               else lambda dynamic, static: "CPU:0")
                step = workload(name)
                fns[f"{name}_{where}_call"] = tf.function(step)
                fns[f"{name}_{where}_loop"] = looped(step, 10)
                fns[f"{name}_{where}_call"]().numpy()
                fns[f"{name}_{where}_loop"]().numpy()
        samples = {name: [] for name in fns}
        for _ in range(5):
            for name, fn in fns.items():
                loop = name.endswith("_loop")
                samples[name].append(timed(fn, 2 if loop else 20) / (10 if loop else 1))
    for name, values in samples.items():
        print(f"{name:14s} {np.median(values):.3f} ms a step")


if __name__ == "__main__":
    main()
