"""A/B (diagnosis, not a benchmark of record): T3 / T1 train steps of tf_gpu_kernel_profile.py
with and without one change of the step, interleaved in one process on one GPU (machines of
one kind differ too much between runs to compare across them).

    python3 ab_train_step.py hypers   # the fused updates' hypers on the tables' GPU / host
    python3 ab_train_step.py dynamic_hypers   # the same for a dynamic table (G1b's step)
    python3 ab_train_step.py counts   # the gradient split given Sok>PartitionKeys' table
                                      # counts / counting (and waiting) itself
"""
import os
import sys

import numpy as np
import tensorflow as tf

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "gpu"))
import sparse_operation_kit.lookup_gradients as sok_lookup_gradients  # noqa: E402
import sparse_operation_kit.optimizer as sok_optimizer  # noqa: E402
from tf_gpu import looped, timed_call  # noqa: E402
from tf_gpu_kernel_profile import workload  # noqa: E402

# change: (module, attribute, the value without the change), with the workloads it touches
CHANGES = {
    "hypers": (sok_optimizer, "_hyper_device", lambda dynamic, static: "CPU:0", ("t3", "t1")),
    "dynamic_hypers": (sok_optimizer, "_hyper_device", lambda dynamic, static: "CPU:0",
                       ("g1b",)),
    "counts": (sok_lookup_gradients, "table_counts_of", lambda keys: tf.zeros([0], tf.int32), ("t1",)),
}


def main(change):
    module, attribute, without, names = CHANGES[change]
    with_change = getattr(module, attribute)
    fns = {}
    with tf.device("GPU:0"):
        for name in names:
            for variant, value in (("with", with_change), ("without", without)):
                setattr(module, attribute, value)  # read when the step is traced, below
                step = workload(name)
                fns[f"{name}_{variant}_call"] = tf.function(step)
                fns[f"{name}_{variant}_loop"] = looped(step, 10)
                fns[f"{name}_{variant}_call"]().numpy()
                fns[f"{name}_{variant}_loop"]().numpy()
        setattr(module, attribute, with_change)
        samples = {name: [] for name in fns}
        for _ in range(5):
            for name, fn in fns.items():
                loop = name.endswith("_loop")
                samples[name].append(timed_call(fn, 2 if loop else 20) / (10 if loop else 1))
    print(f"# {change}: with / without the change, medians of 5 interleaved rounds")
    for name, values in samples.items():
        print(f"{name:18s} {np.median(values):.3f} ms a step")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "hypers")
