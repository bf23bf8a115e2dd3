"""C4: one training step over 26 dynamic tables (the seed notebook's vocabularies as key
spaces), batch 8192, hotness 1..10, dim 16: lookup + backward + lazy Adam, against TensorFlow
Recommenders-Addons 0.7.2 (dynamic_embedding lookup + DynamicEmbeddingOptimizer(Adam), its
documented TF2 path), same process, same batches. Batches are cycled, so after warm-up both
sides look up keys already in their tables.
"""
import os
import sys

import numpy as np
import tensorflow as tf

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import common  # noqa: E402

import sparse_operation_kit as sok  # noqa: E402

DIM = 16


def make_batches(rng, count, batch, vocab_sizes):
    batches = []
    for _ in range(count):
        tables = []
        for vocab in vocab_sizes:
            lengths = rng.integers(1, 11, size=batch)
            ids = rng.integers(0, vocab, size=lengths.sum())
            tables.append(tf.RaggedTensor.from_row_lengths(tf.constant(ids, tf.int64),
                                                           tf.constant(lengths, tf.int64)))
        batches.append(tables)
    return batches


def main():
    args = common.int_options(__doc__, batch=8192, iterations=10, distinct_batches=4)
    import tensorflow_recommenders_addons.dynamic_embedding as de  # benchmark-only competitor

    sok.init(comm_tool="single")
    vocab = common.NOTEBOOK_VOCAB
    batches = make_batches(np.random.default_rng(0), args.distinct_batches, args.batch, vocab)
    sparse_batches = [[b.to_sparse() for b in tables] for tables in batches]
    normal = tf.keras.initializers.RandomNormal(0.0, 0.05)

    tables = [sok.DynamicVariable(DIM, name=f"c4_{i}", init_capacity=2 * v)
              for i, v in enumerate(vocab)]
    optimizer = sok.OptimizerWrapper(tf.keras.optimizers.legacy.Adam(0.001))

    @tf.function
    def sok_step(ids):
        with tf.GradientTape() as tape:
            outputs = sok.lookup_sparse(tables, ids, combiners=["sum"] * len(tables))
            loss = tf.add_n([tf.reduce_sum(o * o) for o in outputs])
        optimizer.apply_gradients(zip(tape.gradient(loss, tables), tables))
        return loss

    tfra_tables = [de.get_variable(f"tfra_c4_{i}", key_dtype=tf.int64, value_dtype=tf.float32,
                                   dim=DIM, initializer=normal) for i in range(len(vocab))]
    tfra_optimizer = de.DynamicEmbeddingOptimizer(tf.keras.optimizers.legacy.Adam(0.001))

    @tf.function
    def tfra_loss(sp_ids):
        losses = []
        for i, (table, ids) in enumerate(zip(tfra_tables, sp_ids)):
            unique, index = tf.unique(ids.values)
            rows = de.embedding_lookup(table, unique, name=f"c4_lookup_{i}")
            pooled = tf.math.unsorted_segment_sum(tf.gather(rows, index), ids.indices[:, 0],
                                                  tf.cast(ids.dense_shape[0], tf.int32))
            losses.append(tf.reduce_sum(pooled * pooled))
        return tf.add_n(losses)

    tfra_loss(sparse_batches[0])  # creates the trainable shadows
    shadows = [t.get_trainable_by_name(f"c4_lookup_{i}") for i, t in enumerate(tfra_tables)]
    state = {"sok": 0, "tfra": 0}

    def run_sok():
        state["sok"] += 1
        sok_step(batches[state["sok"] % len(batches)]).numpy()

    def run_tfra():
        state["tfra"] += 1
        ids = sparse_batches[state["tfra"] % len(batches)]
        tfra_optimizer.minimize(lambda: tfra_loss(ids), var_list=shadows)

    warmup = len(batches) + 1
    sok_ms, tfra_ms = common.interleaved_median_ms([run_sok, run_tfra], warmup=warmup,
                                                   iterations=args.iterations)
    print(f"sok {sok_ms:.1f} ms, tfra {tfra_ms:.1f} ms", flush=True)
    common.report_comparisons("c4_dynamic_training", {
        "benchmark": "C4 training step, 26 dynamic tables, lookup + backward + lazy Adam vs TFRA",
        "config": {"batch": args.batch, "dim": DIM, "hotness": "1..10", "tables": len(vocab),
                   "iterations": args.iterations, "distinct_batches": args.distinct_batches},
        "results": {"C4_train_step": common.comparison(sok_ms, "tfra", tfra_ms, digits=2,
                                                       target=">= 3x")}}, "tfra")


if __name__ == "__main__":
    main()
