"""TF on the GPU (docs/benchmarks.md, "TF on the GPU"): the plugin's GPU OpKernels inside
TensorFlow against plain TensorFlow in the same process, on the same GPU and the same ids.

T1  26 Criteo tables (vocabularies capped at 4M rows), dim 128, batch 65,536, one id per
    sample (Zipf(1.2) modulo each vocabulary), forward and forward + backward + SGD.
    The ids are built once outside the step and passed as the step's argument, as a custom
    training loop hands over a batch already on the GPU (no input pipeline: the feeds of a
    `tf.data` pipeline are measured by tf_vs_tbe.py): sok takes
    RaggedTensors from row lengths (the general fused chain; `sok_*`), the same ids as
    SparseTensors (`sok_sparse_*`) and the one-id form (`from_tensor(ids[:, None])`, uniform
    row length 1, Sok>GatherSingleIds; `sok_one_id_*`); TF takes the SparseTensors
    (per-table tf.nn.safe_embedding_lookup_sparse, legacy SGD).
T2  T1 with 1..10 ids per sample, mean.
T3  one 8Mi x 128 table, batch 65,536, one id per sample: sok vs tf.nn.embedding_lookup;
    sok's train step also with sok.set_id_check("deferred") (`sok_train_deferred_*`: the step
    does not wait for its id check; an out-of-range id fails the next step instead).
G5  the dot interaction forward + backward, batch 65,536, 27 x 128, against TF ops.
Each step is timed two ways: `*_ms` one step per tf.function call, `iters` calls back to back,
waiting for the last; `*_loop_ms` 10 steps inside one call (a tf.range loop, as Keras'
steps_per_execution does), which spreads TensorFlow's per-call dispatch over the loop (the
dynamicemb figures are GPU-event timings). Every step gets its inputs as the function's
argument (never captured as constants). Both sides interleaved in rounds, medians reported.
Writes tf_gpu.json to $OUT.
"""
import json
import os
import sys
import time

import numpy as np
import tensorflow as tf

import sparse_operation_kit as sok

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import provenance  # noqa: E402

CRITEO_TB = [39884406, 39043, 17289, 7420, 20263, 3, 7120, 1543, 63, 38532951, 2953546, 403346,
             10, 2208, 11938, 155, 4, 976, 14, 39979771, 25641295, 39664984, 585935, 12972, 108,
             36]
BATCH, DIM = 65536, 128
COPY_GBPS = 3000.0  # H100 device copy bandwidth, GB/s (docs/benchmarks.md)


def log(*args):
    print(*args, flush=True)


def zipf_ids(rng, vocab, count):
    return (rng.zipf(1.2, size=count) - 1) % vocab


def one_id_lookup(table, ids, training=False):
    """Rows of `table` at `ids`, one id a sample, through sok.lookup_sparse."""
    ragged = tf.RaggedTensor.from_uniform_row_length(ids, 1, validate=False)
    return sok.lookup_sparse([table], [ragged], combiners=["sum"], training=training)[0]


def timed_call(call, iters):
    """Milliseconds a call of `call` (no arguments) takes: `iters` calls back to back after
    one more, waiting for the last."""
    call().numpy()
    start = time.perf_counter()
    for _ in range(iters):
        result = call()
    result.numpy()
    return (time.perf_counter() - start) / iters * 1e3


def timed(fn, inputs, iters):
    """timed_call() of fn on `inputs`."""
    return timed_call(lambda: fn(inputs), iters)


def train_step(loss_of, tables, optimizer):
    """A training step: the loss of the step's inputs, its gradients applied to `tables`."""
    def step(inputs):
        with tf.GradientTape() as tape:
            loss = loss_of(inputs)
        optimizer.apply_gradients(zip(tape.gradient(loss, tables), tables))
        return loss
    return step


def looped(step, loop):
    """A tf.function running `step` `loop` times in a tf.range loop (as Keras'
    steps_per_execution does): per-step time with the per-call dispatch spread over the loop."""
    @tf.function
    def run(inputs):
        total = tf.constant(0.0)
        for _ in tf.range(loop):
            total += step(inputs)
        return total
    return run


def looped_over(step, loop):
    """A tf.function running step(ids[k]) for k < loop in a tf.range loop, summing its results."""
    @tf.function
    def run(ids):
        total = tf.constant(0.0)
        for k in tf.range(loop):
            total += step(ids[k])
        return total
    return run


def interleaved(steps, inputs, rounds=5, iters=10, warmup=3, loop=10):
    """Each step timed one per tf.function call (`name`) and `loop` per call
    (`name` with _ms -> _loop_ms), all interleaved in rounds; medians."""
    fns = {name: tf.function(step) for name, step in steps.items()}
    fns.update({name.replace("_ms", "_loop_ms"): looped(step, loop)
                for name, step in steps.items()})
    for fn in fns.values():
        for _ in range(warmup):
            fn(inputs).numpy()
    samples = {name: [] for name in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            per_call = timed(fn, inputs, iters if "_loop_" not in name else max(1, iters // loop))
            samples[name].append(per_call / loop if "_loop_" in name else per_call)
    return {name: float(np.median(v)) for name, v in samples.items()}


def tables_pair(vocabs, seed):
    """sok.Variables and tf.Variables with equal initial rows, on the GPU."""
    sok_tables, tf_tables = [], []
    for i, vocab in enumerate(vocabs):
        init = tf.random.stateless_uniform([vocab, DIM], [seed, i], -0.05, 0.05)
        sok_tables.append(sok.Variable(init, name=f"sok_t{i}"))
        tf_tables.append(tf.Variable(init, name=f"tf_t{i}"))
        del init
    return sok_tables, tf_tables


def multi_table(name, hotness_max, combiner):
    rng = np.random.default_rng(12)
    vocabs = [min(v, 4_000_000) for v in CRITEO_TB]
    sok_tables, tf_tables = tables_pair(vocabs, 1)
    lengths = (np.ones(BATCH, np.int64) if hotness_max == 1
               else rng.integers(1, hotness_max + 1, size=BATCH))
    nnz = int(lengths.sum())
    ids = [tf.constant(zipf_ids(rng, v, nnz), tf.int64) for v in vocabs]
    row_lengths = tf.constant(lengths)
    # The ids as an input pipeline hands them over: built once, outside the step (a
    # RaggedTensor built inside the step with validation costs ~12 ms of device waits per
    # step for 26 features, on either side).
    ragged = [tf.RaggedTensor.from_row_lengths(i, row_lengths) for i in ids]
    # to_sparse runs on the CPU: ids and indices are brought to the GPU, as a pipeline's
    # prefetch to the device does (dense_shape stays in host memory, where ops read it).
    sparse = [tf.SparseTensor(tf.identity(s.indices), tf.identity(s.values), s.dense_shape)
              for s in (r.to_sparse() for r in ragged)]
    single = [tf.RaggedTensor.from_tensor(i[:, None]) for i in ids] if hotness_max == 1 else None
    sok_opt = sok.OptimizerWrapper(tf.keras.optimizers.legacy.SGD(0.01))
    tf_opt = tf.keras.optimizers.legacy.SGD(0.01)

    def sok_forward(ids):
        return sok.lookup_sparse(sok_tables, list(ids), combiners=[combiner] * 26)

    def tf_forward(inputs):
        return [tf.nn.safe_embedding_lookup_sparse(t, s, combiner=combiner)
                for t, s in zip(tf_tables, inputs["sparse"])]

    def loss_of(outs):
        return tf.add_n([tf.reduce_sum(o) for o in outs])

    def train(forward, tables, optimizer):
        return train_step(lambda inputs: loss_of(forward(inputs)), tables, optimizer)

    def sok_of(form):
        return lambda inputs: sok_forward(inputs[form])

    inputs = {"ragged": ragged, "sparse": sparse}
    steps = {
        "sok_fwd_ms": lambda x: loss_of(sok_of("ragged")(x)),
        "tf_fwd_ms": lambda x: loss_of(tf_forward(x)),
        "sok_train_ms": train(sok_of("ragged"), sok_tables, sok_opt),
        "tf_train_ms": train(tf_forward, tf_tables, tf_opt),
        "sok_sparse_fwd_ms": lambda x: loss_of(sok_of("sparse")(x)),
        "sok_sparse_train_ms": train(sok_of("sparse"), sok_tables, sok_opt),
    }
    if single is not None:
        inputs["single"] = single
        steps["sok_one_id_fwd_ms"] = lambda x: loss_of(sok_of("single")(x))
        steps["sok_one_id_train_ms"] = train(sok_of("single"), sok_tables, sok_opt)
    # Correctness first: before any update both sides pool the same vectors.
    check = {"fwd_max_abs_diff": max(float(np.abs(a.numpy() - b.numpy()).max())
                                     for a, b in zip(sok_forward(ragged), tf_forward(inputs)))}
    result = interleaved(steps, inputs, iters=10, rounds=3 if hotness_max > 1 else 5)
    result.update(check)
    unique = sum(int(tf.size(tf.unique(i)[0])) for i in ids)
    fwd_bytes = 8 * 26 * nnz + 4 * DIM * (unique + 26 * BATCH)
    train_bytes = fwd_bytes + 8 * 26 * nnz + 4 * DIM * (26 * BATCH + 2 * unique)
    result["floor_fwd_ms"] = fwd_bytes / COPY_GBPS / 1e6
    result["floor_train_ms"] = train_bytes / COPY_GBPS / 1e6
    result["unique_ids"] = unique
    del sok_tables, tf_tables
    log(name, json.dumps(result))
    return result


def single_table():
    rng = np.random.default_rng(3)
    vocab = 8 << 20
    sok_tables, tf_tables = tables_pair([vocab], 3)
    ids = tf.constant(rng.integers(0, vocab, size=BATCH), tf.int64)
    sok_opt = sok.OptimizerWrapper(tf.keras.optimizers.legacy.SGD(0.01))
    tf_opt = tf.keras.optimizers.legacy.SGD(0.01)

    single = tf.RaggedTensor.from_tensor(ids[:, None])  # as a pipeline hands it over

    def sok_forward(inputs):
        return sok.lookup_sparse(sok_tables, [inputs["single"]], combiners=["sum"])[0]

    def tf_forward(inputs):
        return tf.nn.embedding_lookup(tf_tables[0], inputs["ids"])

    def train(forward, tables, optimizer):
        return train_step(lambda inputs: tf.reduce_sum(forward(inputs)), tables, optimizer)

    def deferred(step):  # traced with sok.set_id_check("deferred"): no wait for the id check
        def run(inputs):
            sok.set_id_check("deferred")
            try:
                return step(inputs)
            finally:
                sok.set_id_check("strict")
        return run

    inputs = {"single": single, "ids": ids}
    check = float(np.abs(sok_forward(inputs).numpy() - tf_forward(inputs).numpy()).max())
    result = interleaved({
        "sok_fwd_ms": lambda x: tf.reduce_sum(sok_forward(x)),
        "tf_fwd_ms": lambda x: tf.reduce_sum(tf_forward(x)),
        "sok_train_ms": train(sok_forward, sok_tables, sok_opt),
        "sok_train_deferred_ms": deferred(train(sok_forward, sok_tables, sok_opt)),
        "tf_train_ms": train(tf_forward, tf_tables, tf_opt),
    }, inputs, iters=50)
    result["fwd_max_abs_diff"] = check  # before any update
    result["floor_fwd_ms"] = (8 * BATCH + 2 * 4 * DIM * BATCH) / COPY_GBPS / 1e6
    result["floor_train_ms"] = (16 * BATCH + 5 * 4 * DIM * BATCH) / COPY_GBPS / 1e6
    log("T3", json.dumps(result))
    return result


def interaction():
    rng = np.random.default_rng(5)
    features, dim = 27, 128
    x = tf.constant(rng.normal(size=[BATCH, features, dim]).astype(np.float32))
    lower = tf.constant(np.tril(np.ones([features, features]), -1).astype(bool))

    def reference(v):
        dots = tf.matmul(v, v, transpose_b=True)
        return tf.concat([v[:, 0], tf.boolean_mask(dots, lower, axis=1)], 1)

    def step(fn):
        def run(features):
            with tf.GradientTape() as tape:
                tape.watch(features)
                loss = tf.reduce_sum(fn(features))
            return tf.reduce_sum(tape.gradient(loss, features))
        return run

    result = interleaved({"sok_ms": step(sok.dot_interaction), "tf_ms": step(reference)}, x,
                         iters=20)
    width = dim + features * (features - 1) // 2
    result["floor_ms"] = 4 * BATCH * (2 * features * dim + 2 * width) / COPY_GBPS / 1e6
    log("G5", json.dumps(result))
    return result


def start_on_gpu():
    """sok on one worker, on the first GPU: that GPU's name (exits when there is none)."""
    gpus = tf.config.list_physical_devices("GPU")
    if not gpus:
        sys.exit("no GPU visible to TensorFlow")
    sok.init(comm_tool="single")
    return tf.config.experimental.get_device_details(gpus[0]).get("device_name", "GPU")


def main():
    out_dir = provenance.out_dir()
    payload = {"device": start_on_gpu(), "tensorflow": tf.__version__,
               "copy_gbps_assumed": COPY_GBPS, "batch": BATCH, "dim": DIM}
    with tf.device("GPU:0"):
        payload["G5"] = interaction()
        payload["T3"] = single_table()
        payload["T1"] = multi_table("T1", 1, "sum")
        payload["T2"] = multi_table("T2", 10, "mean")
    for key in ("T1", "T2", "T3", "G5"):
        entry = payload[key]
        if "sok_train_ms" in entry:
            entry["speedup_train"] = entry["tf_train_ms"] / entry["sok_train_ms"]
            entry["fraction_of_floor_train"] = entry["floor_train_ms"] / entry["sok_train_ms"]
            entry["speedup_train_loop"] = entry["tf_train_loop_ms"] / entry["sok_train_loop_ms"]
        else:
            entry["speedup"] = entry["tf_ms"] / entry["sok_ms"]
            entry["fraction_of_floor"] = entry["floor_ms"] / entry["sok_ms"]
        if "sok_train_deferred_ms" in entry:
            entry["speedup_train_deferred_loop"] = (entry["tf_train_loop_ms"] /
                                                    entry["sok_train_deferred_loop_ms"])
    with open(os.path.join(out_dir, "tf_gpu.json"), "w") as f:
        json.dump(provenance.stamp(payload, payload["device"]), f, indent=1)
    log(json.dumps(payload, indent=1))


if __name__ == "__main__":
    main()
