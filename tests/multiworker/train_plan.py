"""Run under `horovodrun -np 2 --gloo`: a model built from a plan with data-parallel,
localized and distributed groups trains equal to the same model on one worker with
tf.Variables on the global batch. Prints "PASS rank=<r>"; exits non-zero on a mismatch."""

import horovod.tensorflow as hvd
import numpy as np
import tensorflow as tf

import sparse_operation_kit as sok
from verdict import keras_optimizer, placement_failures, report, start_worker, summed_duplicates

SIZES, DIM, GLOBAL_BATCH, STEPS = [40, 60, 70, 200], 4, 18, 5
PLAN = [  # table 0 dp; 1 localized on worker 0; 2 localized on worker 1; 3 row-sharded
    [{"local_embedding_list": [1], "global_embedding_list": [[1], [2]], "table_placement_strategy": "mp"},
     {"local_embedding_list": [3], "global_embedding_list": [[3], [3]], "table_placement_strategy": "mp",
      "num_sharding": 2, "sharding_id": 0},
     {"local_embedding_list": [0], "global_embedding_list": [[0], [0]], "table_placement_strategy": "dp"}],
    [{"local_embedding_list": [2], "global_embedding_list": [[1], [2]], "table_placement_strategy": "mp"},
     {"local_embedding_list": [3], "global_embedding_list": [[3], [3]], "table_placement_strategy": "mp",
      "num_sharding": 2, "sharding_id": 1},
     {"local_embedding_list": [0], "global_embedding_list": [[0], [0]], "table_placement_strategy": "dp"}],
]


def main():
    start_worker(hvd, sok)
    rank = hvd.rank()
    path = f"/tmp/sok_plan_{hvd.size()}_{rank}.json"
    sok.write_plan(PLAN, path)
    planner = sok.EmbeddingPlanner()
    configs = [sok.EmbeddingTableConfig(i, rows, DIM) for i, rows in enumerate(SIZES)]
    for i, config in enumerate(configs):
        planner.embedding_lookup(config, f"in{i}", f"out{i}", ["sum", "mean", "sum", "mean"][i])
    collection = planner.create_embedding_collection(path)
    kinds = [collection.placements[i].kind.value for i in range(4)]
    assert kinds == ["dp", "localized", "localized", "distributed"], kinds
    references = [tf.Variable(tf.keras.initializers.RandomUniform(-0.05, 0.05, seed=i)([rows, DIM]))
                  for i, rows in enumerate(SIZES)]
    tables = [collection.tables[i] for i in range(4)]
    optimizer = sok.OptimizerWrapper(keras_optimizer("SGD", 0.1, momentum=0.9))
    ref_optimizer = keras_optimizer("SGD", 0.1, momentum=0.9)
    rng = np.random.default_rng(5)
    for step in range(STEPS):
        lengths = [rng.integers(1, 4, size=GLOBAL_BATCH) for _ in SIZES]
        ids = [rng.integers(0, rows, size=l.sum()) for l, rows in zip(lengths, SIZES)]
        cut = 11  # unequal local batches: 11 and 7
        begin, end = (0, cut) if rank == 0 else (cut, GLOBAL_BATCH)

        def ragged(i, b, e):
            starts = np.concatenate([[0], np.cumsum(lengths[i])])
            return tf.RaggedTensor.from_row_lengths(tf.constant(ids[i][starts[b]:starts[e]]),
                                                    tf.constant(lengths[i][b:e], tf.int64))

        with tf.GradientTape() as tape:
            outputs = collection({f"in{i}": ragged(i, begin, end) for i in range(4)})
            loss = tf.add_n([tf.reduce_sum(o * o) for o in outputs.values()]) / GLOBAL_BATCH
        grads = tape.gradient(loss, tables)
        optimizer.apply_gradients(collection.reduce_gradients(zip(grads, tables)))
        with tf.GradientTape() as tape:
            full = [ragged(i, 0, GLOBAL_BATCH) for i in range(4)]
            sums = [tf.reduce_sum(tf.gather(t, x), axis=1) for t, x in zip(references, full)]
            outs = [s if i % 2 == 0 else s / tf.cast(x.row_lengths()[:, None], tf.float32)
                    for i, (s, x) in enumerate(zip(sums, full))]
            ref_loss = tf.add_n([tf.reduce_sum(o * o) for o in outs]) / GLOBAL_BATCH
        ref_grads = map(summed_duplicates, tape.gradient(ref_loss, references))
        ref_optimizer.apply_gradients(zip(ref_grads, references))

    failures = placement_failures(sok, tables)
    for i, (table, ref) in enumerate(zip(tables, references)):
        if isinstance(table, sok.Variable):
            expected = ref.numpy()[table.global_row_ids()]
        else:
            expected = ref.numpy()
        if not np.allclose(table.numpy(), expected, rtol=1e-5, atol=1e-6):
            failures.append(f"table {i} ({kinds[i]}) differs by "
                            f"{np.abs(table.numpy() - expected).max()}")
    report(rank, failures)


if __name__ == "__main__":
    main()
