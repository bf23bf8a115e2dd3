"""C1: fused sok.lookup_sparse forward+backward vs one tf.nn.safe_embedding_lookup_sparse per
table, 26 tables of the seed notebook's sizes, batch 8192, tf.function, same process and data.

Both steps return the pooled outputs as well as the tables' gradients: the gradient of a
plain sum does not need the outputs' values, so otherwise Grappler prunes the forward pooling
of both and the benchmark would time only the backward.

Three forms of the same ids, each timed against TensorFlow fed the same way:
- ragged_args: what an input pipeline hands a step: 26 tf.RaggedTensor arguments of the
  tf.function (built with from_row_lengths, so nothing says each sample holds one id) for
  sok, 26 tf.SparseTensor arguments for TensorFlow. Passing 26 composite tensors into a
  tf.function costs several ms of Python dispatch per call on either side; it is counted.
- sparse_args: 26 tf.SparseTensor arguments on both sides (sok.lookup_sparse takes them as
  SOK's does): the same input type and the same dispatch for both.
- row_splits: the ids' component tensors passed in, the RaggedTensors built inside by
  from_row_splits (the dispatch left out; for TensorFlow the SparseTensors likewise).
- one_id (hotness 1 only): the same components, RaggedTensor.from_tensor(ids[:, None]) inside,
  which states one id per sample in the type: what [batch, 1] id tensors become.
The targets are judged on ragged_args.
"""
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


def ragged_arguments(batches):
    """Per table: (RaggedTensor from row lengths, the same ids as a SparseTensor)."""
    ragged = [tf.RaggedTensor.from_row_lengths(tf.constant(ids, tf.int64),
                                               tf.constant(lengths, tf.int64))
              for ids, lengths in batches]
    return ragged, [r.to_sparse() for r in ragged]


def run_variant(dim, min_hot, max_hot, batch, vocab_sizes, iterations):
    """{form: (sok ms, tf ms)} for the forms the variant has."""
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

    def tf_step(sparse_ids):
        with tf.GradientTape() as tape:
            outputs = [tf.nn.safe_embedding_lookup_sparse(t, ids, combiner="sum")
                       for t, ids in zip(tf_tables, sparse_ids)]
            loss = tf.add_n([tf.reduce_sum(o) for o in outputs])
        return outputs, [g.values for g in tape.gradient(loss, tf_tables)]

    @tf.function
    def sok_row_splits(components):
        return sok_step([tf.RaggedTensor.from_row_splits(values, splits, validate=False)
                         for values, splits in components])

    @tf.function
    def sok_one_id(components):
        return sok_step([tf.RaggedTensor.from_tensor(tf.reshape(values, [-1, 1]))
                         for values, _ in components])

    @tf.function
    def tf_components(components):
        return tf_step([tf.SparseTensor(*c) for c in components])

    ragged, sparse = ragged_components(batches), sparse_components(batches)
    ragged_args, sparse_args = ragged_arguments(batches)
    sok_args, tf_args = tf.function(sok_step), tf.function(tf_step)
    steps = {"ragged_args": (lambda: sok_args(ragged_args), lambda: tf_args(sparse_args)),
             "sparse_args": (lambda: sok_args(sparse_args), lambda: tf_args(sparse_args)),
             "row_splits": (lambda: sok_row_splits(ragged), lambda: tf_components(sparse))}
    if min_hot == max_hot == 1:
        steps["one_id"] = (lambda: sok_one_id(ragged), steps["row_splits"][1])
    fns = [fn for pair in steps.values() for fn in pair]
    times = common.interleaved_median_ms(fns, iterations=iterations)
    return {form: (times[2 * k], times[2 * k + 1]) for k, form in enumerate(steps)}


def geomean(values):
    return math.exp(sum(math.log(v) for v in values) / len(values))


def main():
    args = common.int_options(__doc__, batch=8192, iterations=15)
    sok.init(comm_tool="single")
    rows, results = [], {}
    for name, dim, min_hot, max_hot in VARIANTS:
        forms = run_variant(dim, min_hot, max_hot, args.batch, common.NOTEBOOK_VOCAB,
                            args.iterations)
        results[name] = {form: common.comparison(sok_ms, "tf", tf_ms)
                         for form, (sok_ms, tf_ms) in forms.items()}
        for form, (sok_ms, tf_ms) in forms.items():
            rows.append([name, form, f"{sok_ms:.2f}", f"{tf_ms:.2f}", f"{tf_ms / sok_ms:.2f}x"])
            print(f"{name} {form}: sok {sok_ms:.2f} ms, tf {tf_ms:.2f} ms, "
                  f"{tf_ms / sok_ms:.2f}x", flush=True)
    ragged = [results[name]["ragged_args"]["speedup"] for name in results]
    best = [max(form["speedup"] for form in results[name].values()) for name in results]
    path = common.report("c1_fused_lookup", {
        "benchmark": "C1 fused lookup_sparse forward+backward vs safe_embedding_lookup_sparse per table",
        "config": {"batch": args.batch, "tables": len(common.NOTEBOOK_VOCAB), "combiner": "sum",
                   "iterations": args.iterations, "ids": "uniform in [0, vocab)",
                   "forms": "ragged_args / sparse_args / row_splits / one_id: see the script's "
                             "docstring"},
        "variants": results,
        "geomean_speedup_ragged_args": round(geomean(ragged), 3),
        "min_speedup_ragged_args": round(min(ragged), 3),
        "geomean_speedup_best_form": round(geomean(best), 3),
        "target": "on ragged_args: geomean >= 3x, none under 2x"},
        ["variant", "form", "sok ms", "tf ms", "speedup"], rows)
    print(f"ragged_args: geometric mean {geomean(ragged):.2f}x, lowest {min(ragged):.2f}x; "
          f"written to {path}")


if __name__ == "__main__":
    main()
