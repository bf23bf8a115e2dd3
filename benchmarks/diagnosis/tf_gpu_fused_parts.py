"""Where T1's fused-chain step spends its time on the GPU (diagnosis, not a benchmark of record):
the ragged ids built inside the step (with and without RaggedTensor's validation) against
ragged ids passed in as a pipeline feeds them, the raw Sok>PartitionKeys and
Sok>CombineFromShards ops, and the check that reports out-of-range ids of the one-id gather.
Each a tf.function timed over back-to-back calls ("call") and as 10 steps inside one call
("loop"), as tf_gpu_dynamic.py does."""
import os
import sys

import numpy as np
import tensorflow as tf

import sparse_operation_kit as sok
from sparse_operation_kit import raw_ops

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "gpu"))
from tf_gpu import BATCH, CRITEO_TB, DIM, looped, timed_call, zipf_ids  # noqa: E402

LOOP = 10


def report(name, step):
    call = timed_call(tf.function(step), 10)
    loop = timed_call(looped(step, LOOP), 3) / LOOP
    print(f"{name}: call {call:.3f} ms, loop {loop:.3f} ms/step", flush=True)


def main():
    sok.init(comm_tool="single")
    rng = np.random.default_rng(12)
    vocabs = [min(v, int(os.environ.get("VOCAB_CAP", 4_000_000))) for v in CRITEO_TB]
    hotness = int(sys.argv[1]) if len(sys.argv) > 1 else 1
    with tf.device("GPU:0"):
        tables = [sok.Variable(tf.random.stateless_uniform([v, DIM], [1, i], -0.05, 0.05),
                               name=f"t{i}") for i, v in enumerate(vocabs)]
        lengths = (np.ones(BATCH, np.int64) if hotness == 1
                   else rng.integers(1, hotness + 1, size=BATCH))
        nnz = int(lengths.sum())
        ids = [tf.constant(zipf_ids(rng, v, nnz), tf.int64) for v in vocabs]
        row_lengths = tf.constant(lengths)
        row_splits = tf.constant(np.concatenate([[0], np.cumsum(lengths)]), tf.int64)
        given = [tf.RaggedTensor.from_row_splits(i, row_splits) for i in ids]
        sgd = sok.OptimizerWrapper(tf.keras.optimizers.legacy.SGD(0.01))
        names = [t.name for t in tables]

        def loss_of(outs):
            return tf.add_n([tf.reduce_sum(o) for o in outs])

        def fwd(ragged):
            return loss_of(sok.lookup_sparse(tables, ragged, combiners=["sum"] * 26))

        def train(ragged_fn):
            def step():
                with tf.GradientTape() as tape:
                    loss = fwd(ragged_fn())
                sgd.apply_gradients(zip(tape.gradient(loss, tables), tables))
                return loss
            return step

        def partition():
            _, _, position, _ = raw_ops.sok_partition_keys(
                ids=ids, lookup_table=list(range(26)), table_rows=vocabs, table_owner=[0] * 26,
                table_names=names, num_workers=1, table_dynamic=[False] * 26, pair_keys=False)
            return tf.cast(tf.reduce_sum(tf.cast(position, tf.int64)), tf.float32)

        def partition_combine():
            keys, _, position, _ = raw_ops.sok_partition_keys(
                ids=ids, lookup_table=list(range(26)), table_rows=vocabs, table_owner=[0] * 26,
                table_names=names, num_workers=1, table_dynamic=[False] * 26, pair_keys=False)
            return loss_of(raw_ops.sok_combine_from_shards(
                shards=[t.handle for t in tables], keys=keys, position=position,
                row_splits=[row_splits] * 26, weights=[tf.zeros([0])] * 26,
                combiners=["sum"] * 26, dtype=tf.float32, dim=DIM, validate=False))

        in_step = lambda: [tf.RaggedTensor.from_row_lengths(i, row_lengths) for i in ids]
        unvalidated = lambda: [tf.RaggedTensor.from_row_lengths(i, row_lengths, validate=False)
                               for i in ids]
        print(f"hotness 1..{hotness}, {nnz} ids per table", flush=True)
        report("fwd ragged built in step", lambda: fwd(in_step()))
        report("fwd ragged built in step, validate=False", lambda: fwd(unvalidated()))
        report("fwd ragged given", lambda: fwd(given))
        report("raw partition_keys", partition)
        report("raw partition_keys + combine_from_shards", partition_combine)
        report("train ragged built in step", train(in_step))
        report("train ragged given", train(lambda: given))
        sparse = [tf.SparseTensor(tf.identity(s.indices), tf.identity(s.values), s.dense_shape)
                  for s in (r.to_sparse() for r in given)]
        report("fwd sparse given", lambda: fwd(sparse))
        tf_tables = [tf.Variable(t.read_value()) for t in tables]
        tf_sgd = tf.keras.optimizers.legacy.SGD(0.01)

        def tf_fwd():
            return loss_of([tf.nn.safe_embedding_lookup_sparse(t, s, combiner="sum")
                            for t, s in zip(tf_tables, sparse)])

        def tf_train():
            with tf.GradientTape() as tape:
                loss = tf_fwd()
            tf_sgd.apply_gradients(zip(tape.gradient(loss, tf_tables), tf_tables))
            return loss
        report("tf fwd sparse given", tf_fwd)
        report("tf train sparse given", tf_train)
        del tf_tables
        keys, _, position, counts = raw_ops.sok_partition_keys(
            ids=ids, lookup_table=list(range(26)), table_rows=vocabs, table_owner=[0] * 26,
            table_names=names, num_workers=1, table_dynamic=[False] * 26, pair_keys=False)
        out_grads = [tf.ones([BATCH, DIM])] * 26

        def combine_backward():
            return raw_ops.sok_combine_backward(
                output_grads=out_grads, position=position, row_splits=[row_splits] * 26,
                weights=[tf.zeros([0])] * 26, num_rows=tf.size(keys, out_type=tf.int64),
                combiners=["sum"] * 26, validate=False)

        def split():
            indices, values = raw_ops.sok_split_gradient_by_table(
                keys=keys, grad=combine_backward(), table_counts=counts, num_tables=26)
            return indices, values
        report("raw combine_backward", lambda: tf.reduce_sum(combine_backward()))
        report("raw combine_backward + split", lambda: loss_of(split()[1]))

        def apply():
            indices, values = split()
            sgd.apply_gradients(zip([tf.IndexedSlices(v, i) for i, v in zip(indices, values)],
                                    tables))
            return loss_of(values)
        report("raw combine_backward + split + apply", apply)
        if hotness == 1:
            single = [tf.RaggedTensor.from_tensor(i[:, None]) for i in ids]
            report("fwd one-id", lambda: fwd(single))
            report("train one-id", train(lambda: single))

            def gather(check):
                outs, bad = raw_ops.sok_gather_single_ids(
                    tables=[t.handle for t in tables], ids=ids,
                    dtype=tf.float32, dim=DIM, table_names=names)
                if check:
                    raw_ops.sok_check_gathered_ids(bad, table_names=names)
                return loss_of(outs)
            report("raw gather_single_ids, no check", lambda: gather(False))
            report("raw gather_single_ids + check", lambda: gather(True))


if __name__ == "__main__":
    main()
