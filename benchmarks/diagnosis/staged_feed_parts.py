"""Where the packed form's staged feed spends a step: the pipeline alone, the pipeline and the
batch's crossing to the GPU, and the whole forward, in tf_vs_tbe.py's loop form (LOOP steps
a call) and one step a call, for several settings of the staged map.

    python benchmarks/diagnosis/staged_feed_parts.py IDS_DIR [WORKLOAD ...]   (T1 T2 default)
IDS_DIR as tbe_on_device.sh writes it; any workload of tbe_workloads.py (G2: sequence
lookups). Prints ms a step. WAITS_ONLY=1: only the A/B of waits.
"""
import os
import sys

import tensorflow as tf

import sparse_operation_kit as sok
from sparse_operation_kit._ops import raw_ops

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                "gpu"))
import tf_vs_tbe  # noqa: E402
import tbe_workloads as workloads  # noqa: E402

LOOP = tf_vs_tbe.LOOP


def parts(spec, tables, dataset):
    features = len(spec["vocabs"])

    def pipeline(staged):
        return tf.cast(tf.size(staged.staged), tf.float32)

    def crossing(staged):
        values, _ = raw_ops.sok_unpack_staged_features(staged=staged.staged, plan=staged.plan,
                                                       num_features=features, T=tf.int64)
        return tf.cast(values[0][0], tf.float32)

    forward = tf_vs_tbe.packed_forward(spec, tables)
    train = tf_vs_tbe.trained(forward, tables, sok.OptimizerWrapper(tf_vs_tbe.legacy("sgd")))
    result = {}
    for what, step in (("pipeline", pipeline), ("crossing", crossing), ("fwd", forward),
                       ("train_sgd", train)):
        (call, _), (loop, per_loop), _ = tf_vs_tbe.iterator_feeds(step, dataset)
        result[f"{what}_call"] = tf_vs_tbe.timed(call, 1, 20)
        result[f"{what}_loop"] = tf_vs_tbe.timed(loop, per_loop, 20)
    return result


def staged_once(spec, batches):
    """The staged dataset with its batches staged in the first epoch and cached after: the
    pipeline does no work a step."""
    features = len(spec["vocabs"])
    with tf.device("CPU:0"):
        packed = tf_vs_tbe.packed_dataset_of(spec, batches)._input_dataset  # before prefetch
        return packed.take(len(batches)).map(
            lambda ids: sok.stage_features(ids, features)).cache().repeat().prefetch(2)


def waits(spec, tables, dataset):
    """The SGD step one call a step, A/B/C interleaved in one process: as the library runs it
    (`free`); with the device's id check waited for in the forward (`check_waited`); with the
    host waiting for each step's loss (`synced`); with each one's peak of GPU memory."""
    import sparse_operation_kit.lookup as lookup
    paths = {name: getattr(lookup, name) for name in ("pool_from_tables_path", "single_id_path")}
    optimizer = sok.OptimizerWrapper(tf_vs_tbe.legacy("sgd"))
    train = tf_vs_tbe.trained(tf_vs_tbe.packed_forward(spec, tables), tables, optimizer)
    (free, _), _, _ = tf_vs_tbe.iterator_feeds(train, dataset)
    (waited, _), _, _ = tf_vs_tbe.iterator_feeds(train, dataset)
    for name, path in paths.items():
        setattr(lookup, name, lambda *args, path=path, **kwargs: path(
            *args, **dict(kwargs, ids_checked=False)))
    waited(0)  # traced with the device check waited for
    for name, path in paths.items():
        setattr(lookup, name, path)
    free(0)
    def synced(k):  # two steps a call, the first waited for
        free(k).numpy()
        return free(k)
    result = {}
    for round_ in range(2):
        for what, call in (("free", free), ("check_waited", waited), ("synced", synced)):
            per = 2 if what == "synced" else 1
            if tf.config.list_physical_devices("GPU"):
                tf.config.experimental.reset_memory_stats("GPU:0")
            result[f"{what}_{round_}"] = tf_vs_tbe.timed(call, per, 20)
            if tf.config.list_physical_devices("GPU"):  # GiB held at the peak
                peak = tf.config.experimental.get_memory_info("GPU:0")["peak"]
                result[f"{what}_{round_}_peak_gib"] = peak / 2**30
    return result


def main():
    tf_vs_tbe.IDS_DIR = sys.argv[1]
    names = sys.argv[2:] or ["T1", "T2"]
    sok.init(comm_tool="single")
    for name in names:
        spec = workloads.WORKLOADS[name]
        batches = workloads.load(sys.argv[1], name)
        with tf.device("GPU:0"):
            tables = tf_vs_tbe.make_tables(spec, False, seed=1)
            settings = ((tf.data.AUTOTUNE, 2), (8, 4), (16, 8))
            for parallel, prefetch in settings[:0] if os.environ.get("WAITS_ONLY") else settings:
                dataset = tf_vs_tbe.packed_dataset_of(spec, batches, True, parallel, prefetch)
                times = parts(spec, tables, dataset)
                print(name, f"map parallel {parallel} prefetch {prefetch}:",
                      " ".join(f"{k} {v:.3f}" for k, v in times.items()), flush=True)
            times = waits(spec, tables, tf_vs_tbe.packed_dataset_of(spec, batches, True))
            print(name, "train_sgd a call:", " ".join(f"{k} {v:.3f}" for k, v in times.items()),
                  flush=True)
            times = waits(spec, tables, staged_once(spec, batches))
            print(name, "train_sgd a call, batches staged once and cached:",
                  " ".join(f"{k} {v:.3f}" for k, v in times.items()), flush=True)
            del tables


if __name__ == "__main__":
    main()
