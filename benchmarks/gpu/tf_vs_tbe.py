"""This project's TensorFlow path on the workloads of tbe_workloads.py, fed as users' input
pipelines feed it, beside FBGEMM TBE's figures from tbe_torch.py (same GPU, same ids).

Feeds (never ids captured in the step function as constants):
  args_gpu   each batch's ids already on the GPU, passed as the step function's argument
             (TBE's `device` feed)
  args       batches taken eagerly from a tf.data iterator (host memory) and passed as the
             step function's argument, as a custom training loop does
  data       the iterator read inside the step function, one step a call
  data_loop  the iterator read inside the step function, 10 steps a call (Keras'
             steps_per_execution)
  staged, staged_loop
             the packed form only: as data and data_loop, the pipeline ending in
             `sok.stage_features` (its CPU work on tf.data's threads, into pinned memory, as
             PyTorch's DataLoader pins batches), then prefetch
The dataset holds the batches as RaggedTensors [batch, None] a table (dense ids for G2's
sequence lookups), cached and prefetched; every table kind also runs the packed form
(`sok_packed_*`, dynamic tables `sok_dynpacked_*`: one feature-major RaggedTensor
[tables * batch, None] a batch; pooled, one [batch, tables, dim] output; G2's sequence
lookups, `sok.all2all_dense_embedding` of it, one RaggedTensor [batch, None, dim] a table).
Static tables (`sok.Variable`) everywhere, dynamic tables (`sok.DynamicVariable`) for G2
too; SGD, and Adam where TBE ran it (fused updates through `sok.OptimizerWrapper` of the
legacy Keras optimizers, learning rate 0.01). T3 also runs plain TensorFlow
(`tf.nn.embedding_lookup` of a `tf.Variable`, legacy SGD).

    python benchmarks/gpu/tf_vs_tbe.py IDS_DIR TBE_JSON [WORKLOAD ...]
writes tf_vs_tbe.json to $OUT and IDS_DIR; workloads of an earlier run's IDS_DIR/tf_vs_tbe.json
that this run does not measure are kept.

Each figure is a wall time per step (median of rounds of `iters` steps after warm-up, waiting
for the last); `ratio_*` is TBE's time over ours (above 1: faster than TBE), against TBE's
`device` feed for args_gpu and its `pinned` feed for the host feeds; `floor_*` is the bytes
floor at 3.0 TB/s and `of_floor_*` each side's fraction of it.
"""
import gc
import json
import os
import sys
import time

import numpy as np
import tensorflow as tf

import sparse_operation_kit as sok

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import provenance  # noqa: E402
import tbe_workloads as workloads  # noqa: E402

LOOP = 10
FEEDS = ("args_gpu", "args", "data", "data_loop", "staged", "staged_loop")


def log(*args):
    print(*args, flush=True)


def as_features(spec, batch):
    """One batch as the step receives it: a tuple of RaggedTensors (dense ids for sequence
    lookups)."""
    if not spec["pooled"]:
        return tuple(tf.constant(ids, tf.int64) for ids, _ in batch)
    return tuple(tf.RaggedTensor.from_row_lengths(tf.constant(ids, tf.int64),
                                                  tf.constant(lengths, tf.int64))
                 for ids, lengths in batch)


def as_packed(batch):
    """One batch as a single feature-major RaggedTensor [tables * batch, None]."""
    return tf.RaggedTensor.from_row_lengths(
        tf.constant(np.concatenate([ids for ids, _ in batch]), tf.int64),
        tf.constant(np.concatenate([lengths for _, lengths in batch]), tf.int64))


def packed_dataset_of(spec, batches, staged=False, parallel=tf.data.AUTOTUNE, prefetch=2):
    """The batches as packed RaggedTensors in a cached, repeated, prefetched dataset; with
    `staged`, each batch staged by sok.stage_features after the cache (every step's batch is
    staged anew, `parallel` at a time)."""
    with tf.device("CPU:0"):
        rows = tf.RaggedTensor.from_row_lengths(
            tf.constant(np.concatenate([i for b in batches for i, _ in b]), tf.int64),
            tf.constant(np.concatenate([l for b in batches for _, l in b]), tf.int64))
        per_batch = tf.RaggedTensor.from_uniform_row_length(
            rows, spec["batch"] * len(spec["vocabs"]))
        dataset = tf.data.Dataset.from_tensor_slices(per_batch).cache().repeat()
        if staged:
            features = len(spec["vocabs"])
            dataset = dataset.map(lambda ids: sok.stage_features(ids, features),
                                  num_parallel_calls=parallel)
        return dataset.prefetch(prefetch)


def dataset_of(spec, batches):
    """The batches as a cached, repeated, prefetched tf.data.Dataset (host memory)."""
    with tf.device("CPU:0"):
        per_table = []
        for t in range(len(spec["vocabs"])):
            ids = np.concatenate([b[t][0] for b in batches])
            if not spec["pooled"]:
                per_table.append(tf.constant(ids.reshape(len(batches), -1), tf.int64))
                continue
            lengths = np.concatenate([b[t][1] for b in batches])
            rows = tf.RaggedTensor.from_row_lengths(tf.constant(ids, tf.int64),
                                                    tf.constant(lengths, tf.int64))
            per_table.append(tf.RaggedTensor.from_uniform_row_length(rows, spec["batch"]))
        dataset = tf.data.Dataset.from_tensor_slices(tuple(per_table))
        return dataset.cache().repeat().prefetch(2)


def make_tables(spec, dynamic, seed):
    if dynamic:
        return [sok.DynamicVariable(dimension=workloads.DIM, initializer="uniform",
                                    name=f"dyn{seed}_{t}") for t in range(len(spec["vocabs"]))]
    tables = []
    for t, vocab in enumerate(spec["vocabs"]):
        init = tf.random.stateless_uniform([vocab, workloads.DIM], [seed, t], -0.05, 0.05)
        tables.append(sok.Variable(init, name=f"s{seed}_{t}"))
        del init
    return tables


def sok_forward(spec, tables):
    def forward(features):
        features = list(features)
        if not spec["pooled"]:
            outs = sok.all2all_dense_embedding(tables, features)
        else:
            outs = sok.lookup_sparse(tables, features, combiners=[spec["combiner"]] * len(tables))
        return tf.add_n([tf.reduce_sum(o) for o in outs])
    return forward


def packed_forward(spec, tables):
    """The packed form's forward: one RaggedTensor (or its staged batch) in; pooled, one
    [batch, tables, dim] out, sequence (G2), one RaggedTensor [batch, None, dim] a table."""
    def forward(packed):
        if not spec["pooled"]:
            outs = sok.all2all_dense_embedding(tables, packed)
            return tf.add_n([tf.reduce_sum(o.flat_values) for o in outs])
        return tf.reduce_sum(sok.lookup_sparse(tables, packed, combiners=spec["combiner"]))
    return forward


def packed_steps(spec, tables, name):
    """Forward and train steps of the packed form."""
    forward = packed_forward(spec, tables)
    steps = {"fwd": forward}
    for optimizer in optimizers_of(name):
        steps[f"train_{optimizer}"] = trained(forward, tables,
                                              sok.OptimizerWrapper(legacy(optimizer)))
    return steps


def trained(forward, tables, optimizer):
    def step(features):
        with tf.GradientTape() as tape:
            loss = forward(features)
        grads = tape.gradient(loss, tables)
        optimizer.apply_gradients(zip(grads, tables))
        return loss
    return step


def iterator_feeds(step, dataset):
    """(one step a call, LOOP steps a call), each reading `dataset` inside the function."""
    iterator = iter(dataset)

    @tf.function
    def from_iterator():
        return step(next(iterator))

    @tf.function
    def from_iterator_looped():
        total = tf.constant(0.0)
        for _ in tf.range(LOOP):
            total += step(next(iterator))
        return total

    return (lambda k: from_iterator(), 1), (lambda k: from_iterator_looped(), LOOP), iterator


def feed_functions(step, batches_gpu, dataset, staged_dataset=None):
    """{feed: callable(k) running one call of `step` fed that way} and steps a call."""
    by_argument = tf.function(step)
    data, data_loop, iterator = iterator_feeds(step, dataset)
    feeds = {
        "args_gpu": (lambda k: by_argument(batches_gpu[k % len(batches_gpu)]), 1),
        "args": (lambda k: by_argument(next(iterator)), 1),
        "data": data,
        "data_loop": data_loop,
    }
    if staged_dataset is not None:
        feeds["staged"], feeds["staged_loop"], _ = iterator_feeds(step, staged_dataset)
    return feeds


def timed(call, per_call, iters, warmup=3, rounds=3):
    for k in range(warmup):
        call(k).numpy()
    calls = max(1, iters // per_call)
    samples = []
    for _ in range(rounds):
        start = time.perf_counter()
        for k in range(calls):
            result = call(k)
        result.numpy()
        samples.append((time.perf_counter() - start) / (calls * per_call) * 1e3)
    return float(np.median(samples))


def measure_side(prefix, spec, steps, batches_gpu, dataset, iters, staged_dataset=None):
    result = {}
    for what, step in steps.items():
        feeds = feed_functions(step, batches_gpu, dataset, staged_dataset)
        for feed, (call, per_call) in feeds.items():
            result[f"{prefix}_{what}_{feed}_ms"] = timed(call, per_call, iters)
    return result


def optimizers_of(name):
    return ["sgd", "adam"] if name in ("T1", "T2", "G2", "G1b") else ["sgd"]


def legacy(optimizer):
    if optimizer == "adam":
        return tf.keras.optimizers.legacy.Adam(0.01, epsilon=1e-7)
    return tf.keras.optimizers.legacy.SGD(0.01)


def measure(name, iters=20):
    spec = workloads.WORKLOADS[name]
    batches = workloads.load(IDS_DIR, name)
    batches_gpu = [as_features(spec, batch) for batch in batches]
    dataset = dataset_of(spec, batches)
    result = {}
    kinds = ["static", "dynamic"] if name == "G2" else ["static"]
    for kind in kinds:
        tables = make_tables(spec, kind == "dynamic", seed=len(result) + 1)
        forward = sok_forward(spec, tables)
        steps = {"fwd": forward}
        for optimizer in optimizers_of(name):
            steps[f"train_{optimizer}"] = trained(
                forward, tables, sok.OptimizerWrapper(legacy(optimizer)))
        result.update(measure_side(f"sok_{kind}", spec, steps, batches_gpu, dataset, iters))
        # The list form's optimizer slots go before the packed form makes its own (T1's
        # tables with two sets of Adam slots do not fit an 80 GB GPU).
        del steps, forward
        gc.collect()
        result.update(measure_side("sok_packed" if kind == "static" else "sok_dynpacked",
                                   spec, packed_steps(spec, tables, name),
                                   [as_packed(b) for b in batches],
                                   packed_dataset_of(spec, batches), iters,
                                   packed_dataset_of(spec, batches, staged=True)))
        del tables
        gc.collect()
    if name == "T3":  # plain TensorFlow, same ids
        table = tf.Variable(tf.random.stateless_uniform([spec["vocabs"][0], workloads.DIM],
                                                        [9, 0], -0.05, 0.05))

        def plain_forward(features):
            return tf.reduce_sum(tf.nn.embedding_lookup(table, features[0].values))
        steps = {"fwd": plain_forward,
                 "train_sgd": trained(plain_forward, [table],
                                      tf.keras.optimizers.legacy.SGD(0.01))}
        result.update(measure_side("tf_plain", spec, steps, batches_gpu, dataset, iters))
        del table
    fwd_floor, train_floor = workloads.floor_ms(name, batches)
    result["floor_fwd_ms"], result["floor_train_sgd_ms"] = fwd_floor, train_floor
    result["floor_train_adam_ms"] = workloads.floor_ms(name, batches, 2 * workloads.DIM)[1]
    log(name, json.dumps(result))
    return result


def compare(ours, tbe):
    """Ratios (TBE time / ours) and fractions of the floor, for every figure of ours."""
    out = {}
    for key, ms in ours.items():
        if not key.startswith(("sok_", "tf_")) or not key.endswith("_ms"):
            continue
        what = key.split("_", 2)[2][:-3]  # fwd_args_gpu / train_sgd_data_loop ...
        step, feed = next((what[:-len(f) - 1], f) for f in
                          sorted(FEEDS, key=len, reverse=True) if what.endswith(f))
        tbe_feed = "device" if feed == "args_gpu" else "pinned"
        tbe_ms = tbe.get(f"{step}_{tbe_feed}_ms")
        if tbe_ms:
            out[key.replace("_ms", "_ratio_to_tbe")] = tbe_ms / ms
        floor = ours.get(f"floor_{step}_ms")
        if floor:
            out[key.replace("_ms", "_of_floor")] = floor / ms
    for key, ms in tbe.items():
        step = key.rsplit("_", 2)[0]
        floor = ours.get(f"floor_{step}_ms")
        if floor and key.endswith("_ms"):
            out[f"tbe_{key[:-3]}_of_floor"] = floor / ms
    return out


def main():
    global IDS_DIR
    IDS_DIR, tbe_path = sys.argv[1], sys.argv[2]
    names = sys.argv[3:] or list(workloads.WORKLOADS)
    with open(tbe_path) as handle:
        tbe = json.load(handle)
    gpus = tf.config.list_physical_devices("GPU")
    if not gpus and workloads.SCALE == 1:
        sys.exit("no GPU visible to TensorFlow")
    sok.init(comm_tool="single")
    details = tf.config.experimental.get_device_details(gpus[0]) if gpus else {}
    payload = {"device": details.get("device_name", provenance.device()),
               "scale": workloads.SCALE, "dim": workloads.DIM,
               "copy_gbps_assumed": workloads.COPY_GBPS, "loop": LOOP,
               "tbe_provenance": tbe.get("provenance")}
    kept = os.path.join(IDS_DIR, "tf_vs_tbe.json")  # workloads measured by earlier runs
    if os.path.exists(kept):
        with open(kept) as handle:
            earlier = json.load(handle)
        for name in workloads.WORKLOADS:  # each workload names the GPU of its job
            if name in earlier and name not in names:
                payload[name] = dict(earlier[name])
                payload[name].setdefault("device", earlier.get("device"))
    for name in names:
        with tf.device("GPU:0" if gpus else "CPU:0"):
            ours = measure(name)
        payload[name] = {"device": payload["device"], "sok": ours, "tbe": tbe.get(name, {})}
        payload[name].update(compare(ours, tbe.get(name, {})))
        stamped = provenance.stamp(payload, payload["device"])
        for path in (kept, os.path.join(provenance.out_dir(), "tf_vs_tbe.json")):
            with open(path, "w") as handle:
                json.dump(stamped, handle, indent=1)
    log(json.dumps(payload, indent=1))


if __name__ == "__main__":
    main()
