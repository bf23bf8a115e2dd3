"""Run under `horovodrun -np N` on N GPUs: the plugin's NCCL exchange (Sok>AllToAllCounts,
Sok>AllToAll) against Horovod's all-to-all of the same rows on the CPU (Gloo), for several
dtypes and row shapes, random splits with empty ones, eagerly and in a tf.function, and its
gradient (the rows' gradients travel back to their senders). Prints "PASS rank=<r>"."""
import horovod.tensorflow as hvd
import numpy as np
import tensorflow as tf

import sparse_operation_kit as sok
from sparse_operation_kit import communication
from verdict import report, start_worker

DTYPES = [tf.float32, tf.float16, tf.int64, tf.bfloat16]


def reference(values, splits):
    """Horovod's all-to-all on the CPU of the values as float64 (exact for every dtype here)."""
    with tf.device("/CPU:0"):
        received, received_splits = hvd.alltoall(tf.cast(values, tf.float64), splits=splits)
    return received.numpy(), received_splits.numpy()


def main():
    start_worker(hvd, sok)
    rank, workers = hvd.rank(), hvd.size()
    failures = [] if communication.exchange_device() else ["the GPU exchange is not in use"]
    rng = np.random.default_rng(100 + rank)
    for trial in range(12):
        dtype = DTYPES[trial % len(DTYPES)]
        splits = rng.integers(0, 40, size=workers).astype(np.int32)
        if trial % 3 == 0:
            splits[rng.integers(workers)] = 0  # some worker gets nothing from this one
        if trial == 5:
            splits[:] = 0  # an empty local batch
        shape = [int(splits.sum())] + ([3, 5] if trial % 2 else [7])
        values = tf.cast(rng.normal(size=shape) * 100, dtype)
        expected, expected_splits = reference(values, splits)
        exchange = communication.alltoall
        if trial % 2:
            exchange = tf.function(communication.alltoall)
        received, received_splits = exchange(values, tf.constant(splits))
        if not np.array_equal(received_splits.numpy(), expected_splits):
            failures.append(f"trial {trial}: counts {received_splits.numpy()} != {expected_splits}")
        elif not np.array_equal(tf.cast(received, tf.float64).numpy(), expected):
            failures.append(f"trial {trial} ({dtype.name}): rows differ")
        if "GPU" not in received.device:
            failures.append(f"trial {trial}: output on {received.device}")
    # Gradient: d/dx sum(w * alltoall(x)) is w sent back along the same routes.
    splits = rng.integers(1, 20, size=workers).astype(np.int32)
    x = tf.constant(rng.normal(size=[int(splits.sum()), 4]), tf.float32)
    with tf.GradientTape() as tape:
        tape.watch(x)
        received, received_splits = communication.alltoall(x, tf.constant(splits))
        weights = tf.constant(rng.normal(size=received.shape), tf.float32)
        loss = tf.reduce_sum(received * weights)
    grad = tape.gradient(loss, x)
    expected, _ = reference(weights, received_splits.numpy())
    if not np.allclose(grad.numpy(), expected):
        failures.append("the gradient did not travel back to the senders")
    report(rank, failures)


if __name__ == "__main__":
    main()
