"""C1: fused sok.lookup_sparse forward+backward vs one tf.nn.safe_embedding_lookup_sparse per
table, 26 tables of the seed notebook's sizes, batch 8192, tf.function, same process and data.

Both steps return the pooled outputs as well as the tables' gradients: the gradient of a
plain sum does not need the outputs' values, so otherwise Grappler prunes the forward pooling
of both and the benchmark would time only the backward.

Fixed-hotness-1 batches reach sok as RaggedTensor.from_tensor(ids[:, None]), the form such
features come in, which takes sok's one-id path (rows straight from the tables, gradients as
tf.gather gives them); `sok_fused_ms` times the same data passed by row lengths, through the
fused dedup chain, so both paths are on record.

The steps take the ids' component tensors and build their SparseTensor / RaggedTensor
inside, as a step fed by tf.data does: passing 26 composite tensors into a tf.function costs
2-3 ms of Python dispatch per call (for either side), which is not lookup work.
"""
import argparse
import math
import os
import sys

import numpy as np
import tensorflow as tf

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import common  # noqa: E402

import sparse_operation_kit as sok  # noqa: E402

VARIANTS = [("dim128_hot1", 128, 1, 1), ("dim16_hot1", 16, 1, 1), ("dim128_hot1-10", 128, 1, 10)]


def make_batch(rng, batch, vocab_sizes, min_hot, max_hot):
    """Per table: (ids, row lengths) as NumPy arrays."""
    batches = []
    for vocab in vocab_sizes:
        lengths = rng.integers(min_hot, max_hot + 1, size=batch)
        batches.append((rng.integers(0, vocab, size=lengths.sum()), lengths))
    return batches


def ragged_components(batches):
    return [(tf.constant(ids, tf.int64), tf.constant(np.concatenate([[0], np.cumsum(lengths)]),
                                                     tf.int64)) for ids, lengths in batches]


def sparse_components(batches):
    components = []
    for ids, lengths in batches:
        rows = np.repeat(np.arange(len(lengths)), lengths)
        columns = np.arange(len(ids)) - np.repeat(np.cumsum(lengths) - lengths, lengths)
        components.append((tf.constant(np.stack([rows, columns], axis=1), tf.int64),
                           tf.constant(ids, tf.int64),
                           tf.constant([len(lengths), max(lengths.max(), 1)], tf.int64)))
    return components


def run_variant(dim, min_hot, max_hot, batch, vocab_sizes, iterations):
    rng = np.random.default_rng(0)
    initial = [tf.random.stateless_uniform([v, dim], seed=[i, 0]) for i, v in enumerate(vocab_sizes)]
    sok_tables = [sok.Variable(value) for value in initial]
    tf_tables = [tf.Variable(value) for value in initial]
    del initial
    batches = make_batch(rng, batch, vocab_sizes, min_hot, max_hot)
    combiners = ["sum"] * len(vocab_sizes)

    def sok_step(ids):
        with tf.GradientTape() as tape:
            outputs = sok.lookup_sparse(sok_tables, ids, combiners=combiners)
            loss = tf.add_n([tf.reduce_sum(o) for o in outputs])
        return outputs, [g.values for g in tape.gradient(loss, sok_tables)]

    @tf.function
    def sok_fused(components):
        return sok_step([tf.RaggedTensor.from_row_splits(values, splits, validate=False)
                         for values, splits in components])

    @tf.function
    def sok_uniform(components):
        # One id per sample, stated in the type: what [batch, 1] id tensors become.
        return sok_step([tf.RaggedTensor.from_tensor(tf.reshape(values, [-1, 1]))
                         for values, _ in components])

    @tf.function
    def tf_step(components):
        with tf.GradientTape() as tape:
            outputs = [tf.nn.safe_embedding_lookup_sparse(t, tf.SparseTensor(*c), combiner="sum")
                       for t, c in zip(tf_tables, components)]
            loss = tf.add_n([tf.reduce_sum(o) for o in outputs])
        return outputs, [g.values for g in tape.gradient(loss, tf_tables)]

    ragged, sparse = ragged_components(batches), sparse_components(batches)
    steps = [lambda: tf_step(sparse), lambda: sok_fused(ragged)]
    if min_hot == max_hot == 1:
        steps.append(lambda: sok_uniform(ragged))
    tf_ms, fused_ms, *uniform_ms = common.interleaved_median_ms(steps, iterations=iterations)
    return (uniform_ms[0] if uniform_ms else fused_ms), fused_ms, tf_ms


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--batch", type=int, default=8192)
    parser.add_argument("--iterations", type=int, default=15)
    args = parser.parse_args()
    sok.init(comm_tool="single")
    rows, results = [], {}
    for name, dim, min_hot, max_hot in VARIANTS:
        sok_ms, fused_ms, tf_ms = run_variant(dim, min_hot, max_hot, args.batch,
                                              common.NOTEBOOK_VOCAB, args.iterations)
        ratio = tf_ms / sok_ms
        results[name] = {"sok_ms": round(sok_ms, 3), "tf_ms": round(tf_ms, 3),
                         "speedup": round(ratio, 3), "sok_fused_ms": round(fused_ms, 3),
                         "fused_speedup": round(tf_ms / fused_ms, 3)}
        rows.append([name, f"{sok_ms:.2f}", f"{fused_ms:.2f}", f"{tf_ms:.2f}", f"{ratio:.2f}x",
                     f"{tf_ms / fused_ms:.2f}x"])
        print(f"{name}: sok {sok_ms:.2f} ms (fused chain {fused_ms:.2f} ms), tf {tf_ms:.2f} ms, "
              f"{ratio:.2f}x", flush=True)
    geomean = math.exp(sum(math.log(r["speedup"]) for r in results.values()) / len(results))
    path = common.write_result("c1_fused_lookup", {
        "benchmark": "C1 fused lookup_sparse forward+backward vs safe_embedding_lookup_sparse per table",
        "config": {"batch": args.batch, "tables": len(common.NOTEBOOK_VOCAB), "combiner": "sum",
                   "iterations": args.iterations, "ids": "uniform in [0, vocab)"},
        "variants": results, "geomean_speedup": round(geomean, 3),
        "target": "geomean >= 3x, none under 2x"})
    print(common.markdown_table(["variant", "sok ms", "sok fused chain ms", "tf ms", "speedup",
                                 "fused chain speedup"], rows))
    print(f"geometric mean speedup {geomean:.2f}x; written to {path}")


if __name__ == "__main__":
    main()
