"""Where T3's step goes when its ids come from tf.data (diagnosis, not a benchmark of record):
tf_vs_tbe.py's T3 (one 8Mi x 128 table, 65,536 samples of one id, ragged from row lengths)
fed from its cached dataset, one step a call and LOOP steps a call, through each lookup path
the plugin has and through plain TensorFlow, so that the cost of each part (the host id
check, the row splits' copy or their elision, the pooling kernel, the deferred device check)
reads as a difference. Then TensorFlow's profiler timeline of the default path and of plain TF, each in
a process of its own.

    python3 t3_feed_parts.py [IDS_DIR] [--timeline | --timeline-of=VARIANT]

Needs tbe_workloads.py's T3 ids in IDS_DIR (written there if missing; TBE_SCALE=n shrinks
the workload for a run on a CPU).
"""
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "gpu"))
sys.path.insert(0, HERE)

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
from tensorflow.python.ops import resource_variable_ops  # noqa: E402

import sparse_operation_kit as sok  # noqa: E402
from sparse_operation_kit import lookup_inputs, lookup_paths  # noqa: E402
from sparse_operation_kit._ops import raw_ops  # noqa: E402
import tbe_workloads as workloads  # noqa: E402
import tf_vs_tbe  # noqa: E402

ITERS = 200
ROUNDS = 5


def lookups_of(tables, features):
    return lookup_inputs.validate_lookups(tables, list(features), None, ["sum"] * len(tables))


def forwards(tables, plain):
    """{variant: forward(features) -> loss}."""
    dim = workloads.DIM

    def via(path):
        def forward(features):
            return tf.add_n([tf.reduce_sum(o) for o in path(lookups_of(tables, features))])
        return forward

    def serial_pinned(lookups):
        """The host check before the lookup rather than beside it: the lookup reads the ids
        and row splits the check copied into pinned memory (one DMA each), so it waits for
        the host's pass."""
        for lookup in lookups:
            resource_variable_ops.variable_accessed(lookup.table)
        with tf.device("CPU:0"):
            ids, splits = raw_ops.sok_check_ids_on_host(
                ids=[lookup.ids for lookup in lookups],
                row_splits=[lookup.row_splits for lookup in lookups],
                rows=[lookup_inputs.placement_attrs(lookup.table)[0] for lookup in lookups],
                table_names=[lookup.table.name for lookup in lookups])
        outputs, _ = raw_ops.sok_pool_from_tables(
            tables=[lookup.table.handle for lookup in lookups],
            ids=[tf.cast(i, tf.int64) for i in ids], row_splits=splits,
            weights=[tf.zeros([0], tf.float32) for _ in lookups], num_outputs=len(lookups),
            combiners=[lookup.combiner for lookup in lookups], dim=dim,
            table_names=[lookup.table.name for lookup in lookups], host_checked=True)
        return outputs

    def unchecked(lookups):
        """The pooled lookup with no id check at all: what the check costs, by difference."""
        for lookup in lookups:
            resource_variable_ops.variable_accessed(lookup.table)
        outputs, _ = raw_ops.sok_pool_from_tables(
            tables=[lookup.table.handle for lookup in lookups],
            ids=[tf.cast(lookup.ids, tf.int64) for lookup in lookups],
            row_splits=[lookup.row_splits for lookup in lookups],
            weights=[tf.zeros([0], tf.float32) for _ in lookups], num_outputs=len(lookups),
            combiners=[lookup.combiner for lookup in lookups], dim=dim,
            table_names=[lookup.table.name for lookup in lookups], host_checked=True)
        return outputs

    def splits_copied(lookups):
        """The default (ids and row splits checked on the host beside the lookup) with the row
        splits copied to the GPU as they are, not elided where each sample holds one id
        (Sok>ElideOneIdRowSplits): what the elision saves, by difference."""
        verdict, _ = lookup_inputs.host_verdict(lookups, with_row_splits=True)
        return lookup_inputs.after_verdict(verdict, unchecked(lookups))

    def either_on_host(lookups):
        """The one-id gather or the default pooled lookup, chosen each step by a tf.cond on
        the pipeline's row splits in host memory (Sok>EverySampleHoldsOneId, so nothing waits
        for the GPU): what the one-id gather would give the ragged form (forward only)."""
        return tf.cond(raw_ops.sok_every_sample_holds_one_id(
                           row_splits=[lookup.row_splits for lookup in lookups]),
                       lambda: lookup_paths.single_id_path(lookups, dim),
                       lambda: lookup_paths.pool_from_tables_path(lookups, dim))

    def tf_plain(features):
        return tf.reduce_sum(tf.nn.embedding_lookup(plain, features[0].values))

    def tf_plain_splits(features):  # plain TF, the row splits copied over as well
        splits = tf.identity(features[0].row_splits)
        return tf_plain(features) + tf.cast(tf.reduce_sum(splits), tf.float32) * 0.0

    sok_forward = tf_vs_tbe.sok_forward(dict(pooled=True, combiner="sum"), tables)
    return {
        "sok": sok_forward,
        "serial_pinned": via(serial_pinned),
        "unchecked": via(unchecked),
        "splits_copied": via(splits_copied),
        "either_on_host": via(either_on_host),
        "single": via(lambda l: lookup_paths.single_id_path(l, dim)),
        "tf": tf_plain,
        "tf_splits": tf_plain_splits,
    }


TRAINED = ("sok", "serial_pinned", "unchecked", "splits_copied", "single", "tf")


TIMELINES = ("sok", "tf", "sok_train", "tf_train", "serial_pinned")


def main():
    ids_dir = next((a for a in sys.argv[1:] if not a.startswith("--")), "/tmp/tbe_ids")
    only = next((a.split("=", 1)[1] for a in sys.argv[1:] if a.startswith("--timeline-of=")), None)
    if not os.path.exists(os.path.join(ids_dir, "T3.npz")):
        os.makedirs(ids_dir, exist_ok=True)
        workloads.write(ids_dir, "T3")
    for gpu in tf.config.list_physical_devices("GPU"):  # room for the timelines' processes
        tf.config.experimental.set_memory_growth(gpu, True)
    sok.init(comm_tool="single")
    spec, batches = workloads.WORKLOADS["T3"], workloads.load(ids_dir, "T3")
    dataset = tf_vs_tbe.dataset_of(spec, batches)
    with tf.device("GPU:0" if tf.config.list_logical_devices("GPU") else "CPU:0"):
        tables = tf_vs_tbe.make_tables(spec, False, seed=1)
        plain = tf.Variable(tf.random.stateless_uniform([spec["vocabs"][0], workloads.DIM],
                                                        [9, 0], -0.05, 0.05))
        steps = forwards(tables, plain)
        for name in TRAINED:
            optimizer = tf.keras.optimizers.legacy.SGD(0.01)
            train = tf_vs_tbe.trained(steps[name], [plain] if name == "tf" else tables,
                                      optimizer if name == "tf" else sok.OptimizerWrapper(optimizer))
            steps[f"{name}_train"] = train
        if only is not None:
            return timeline(only, steps[only], dataset)
        feeds = {name: tf_vs_tbe.iterator_feeds(step, dataset)[:2] for name, step in steps.items()}
        samples = {name: ([], []) for name in feeds}
        for _ in range(ROUNDS):  # variants interleaved, so that a drift of the machine hits all
            for name, ((call, _), (loop, per_loop)) in feeds.items():
                samples[name][0].append(tf_vs_tbe.timed(call, 1, ITERS, rounds=1))
                samples[name][1].append(tf_vs_tbe.timed(loop, per_loop, ITERS, rounds=1))
        for name, (calls, loops) in samples.items():
            print(f"T3 {name}: data {np.median(calls):.3f} data_loop {np.median(loops):.3f} ms a "
                  f"step (median of {ROUNDS} rounds)", flush=True)
    if "--timeline" in sys.argv:
        # One process a timeline: CUPTI hands a process its GPU events for one profile only.
        for name in TIMELINES:
            subprocess.run([sys.executable, __file__, ids_dir, f"--timeline-of={name}"],
                           check=False)


def timeline(name, step, dataset):
    import tf_gpu_kernel_profile as profile
    (call, _), _, _ = tf_vs_tbe.iterator_feeds(step, dataset)
    wall_ms = tf_vs_tbe.timed(call, 1, ITERS)
    space = profile.profiled_space(lambda: call(0))
    try:
        profile.print_timeline(f"T3 {name}", space, wall_ms)
    except SystemExit as empty:  # a profile CUPTI left without GPU events
        print(f"# T3 {name}: {empty}", flush=True)


if __name__ == "__main__":
    main()
