"""Probe (diagnosis, not a benchmark of record): what bringing a tf.data batch of ragged ids
to the GPU costs inside a step, by how the batch crosses. T2's batch shape (26 features of
65,536 samples, 1..10 int64 ids each): every component is summed on the GPU, nothing else.

  no_crossing the components' sizes summed on the CPU: the pipeline alone
  direct      the iterator's tensors read by GPU ops (TensorFlow copies each one)
  deepcopy    each component copied on the CPU first (tf.raw_ops.DeepCopy), so the copy that
              crosses is one TensorFlow allocates for a GPU consumer
  concat      all components concatenated on the CPU into one tensor, one crossing
  int32       the ids and row splits cast to int32 on the CPU, then as direct
  to_device   the dataset ends in tf.data.experimental.prefetch_to_device
ms a step, 20 steps a round, median of 3 rounds.
"""
import time

import numpy as np
import tensorflow as tf

FEATURES, BATCH = 26, 65536


def dataset(rng):
    per_feature = []
    for _ in range(FEATURES):
        lengths = rng.integers(1, 11, size=4 * BATCH)
        ids = rng.integers(0, 1 << 22, size=lengths.sum())
        rows = tf.RaggedTensor.from_row_lengths(ids, lengths)
        per_feature.append(tf.RaggedTensor.from_uniform_row_length(rows, BATCH))
    return tf.data.Dataset.from_tensor_slices(tuple(per_feature)).cache().repeat()


def components(batch):
    return [t for r in batch for t in (r.values, r.row_splits)]


def gpu_sum(tensors):
    with tf.device("GPU:0"):
        return tf.add_n([tf.reduce_sum(tf.cast(t, tf.float32)) for t in tensors])


def staged(stage):
    def step(batch):
        with tf.device("CPU:0"):
            tensors = stage(components(batch))
        return gpu_sum(tensors)
    return step


def concat(tensors):
    return [tf.concat(tensors, 0)]


VARIANTS = {
    "no_crossing": lambda batch: tf.cast(tf.add_n([tf.size(t) for t in components(batch)]),
                                         tf.float32),
    "direct": staged(lambda ts: ts),
    "deepcopy": staged(lambda ts: [tf.raw_ops.DeepCopy(x=t) for t in ts]),
    "concat": staged(concat),
    "int32": staged(lambda ts: [tf.cast(t, tf.int32) for t in ts]),
}


def timed(fn, rounds=3, steps=20):
    for _ in range(3):
        fn().numpy()
    samples = []
    for _ in range(rounds):
        start = time.perf_counter()
        for _ in range(steps):
            out = fn()
        out.numpy()
        samples.append((time.perf_counter() - start) / steps * 1e3)
    return float(np.median(samples))


def main():
    data = dataset(np.random.default_rng(1)).prefetch(2)
    results = {}
    for name, step in VARIANTS.items():
        iterator = iter(data)
        fn = tf.function(lambda step=step, iterator=iterator: step(next(iterator)))
        results[name] = timed(fn)
    on_device = data.apply(tf.data.experimental.prefetch_to_device("/gpu:0", 2))
    iterator = iter(on_device)
    results["to_device"] = timed(tf.function(lambda: gpu_sum(components(next(iterator)))))
    bytes_per_batch = sum(int(tf.size(t)) * 8 for t in components(next(iter(data))))
    results["mb_per_batch"] = bytes_per_batch / 1e6
    print("H2D", results, flush=True)


if __name__ == "__main__":
    main()
