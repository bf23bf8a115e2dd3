"""G6 and G6x on several GPUs: run under `horovodrun -np N` (one GPU per worker).

G6   26 Criteo Terabyte tables (vocabularies capped at 4M rows, distributed over the
     workers), dim 128, 8,192 samples per GPU, 1..10 ids per sample (Zipf(1.2) modulo each
     vocabulary), mean, Adam through sok.OptimizerWrapper: the train step, and its split:
     forward + backward without the update, the update (step minus that), the exchange (the
     step's three all-to-alls alone: keys, rows back, gradients forward, at the sizes the step
     sends), the lookup (forward + backward minus the exchange).
G6x  all-to-all of 16 and 64 MiB per GPU (float32 rows, equal splits): the plugin's NCCL
     exchange (Sok>AllToAll) against hvd.alltoall of the same GPU tensors, 20 exchanges
     chained in one tf.function, time per exchange, in GB/s per GPU
     (buffer bytes / time, PyTorch's unit; benchmarks/gpu/torch_a2a.py measures PyTorch's
     all_to_all_single in the same job).
Times are the slowest worker's, medians over rounds. Rank 0 writes tf_multi_gpu_tf.json to $OUT.
"""
import json
import os
import sys
import time

import horovod.tensorflow as hvd
import numpy as np
import tensorflow as tf

import sparse_operation_kit as sok
from sparse_operation_kit import communication

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from tf_gpu import CRITEO_TB, provenance, zipf_ids  # noqa: E402

DIM, LOCAL_BATCH, HOTNESS = 128, 8192, 10
CHAIN = 20


def log(*args):
    if hvd.rank() == 0:
        print(*args, flush=True)


def slowest(ms):
    return float(hvd.allreduce(tf.constant(ms, tf.float64), op=hvd.Max, name=None).numpy())


def timed(fn, iters):
    float(tf.reduce_sum(tf.cast(fn(), tf.float64)))
    start = time.perf_counter()
    for _ in range(iters):
        result = fn()
    float(tf.reduce_sum(tf.cast(result, tf.float64)))
    return (time.perf_counter() - start) / iters * 1e3


def interleaved(fns, rounds=5, iters=10):
    samples = {name: [] for name in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            samples[name].append(slowest(timed(fn, iters)))
    return {name: float(np.median(v)) for name, v in samples.items()}


def g6():
    rng = np.random.default_rng(1000 + hvd.rank())
    vocabs = [min(v, 4_000_000) for v in CRITEO_TB]
    tables = [sok.Variable(shape=[v, DIM], initializer=tf.keras.initializers.RandomUniform(
        -0.05, 0.05, seed=i), name=f"g6_t{i}") for i, v in enumerate(vocabs)]
    lengths = rng.integers(1, HOTNESS + 1, size=LOCAL_BATCH)
    nnz = int(lengths.sum())
    ids = [tf.constant(zipf_ids(rng, v, nnz), tf.int64) for v in vocabs]
    row_lengths = tf.constant(lengths)
    wrapper = sok.OptimizerWrapper(tf.keras.optimizers.legacy.Adam(0.001))

    def gradients():
        with tf.GradientTape() as tape:
            outs = sok.lookup_sparse(tables, [tf.RaggedTensor.from_row_lengths(i, row_lengths)
                                              for i in ids], combiners=["mean"] * len(tables))
            loss = tf.add_n([tf.reduce_sum(o * o) for o in outs])
        return loss, tape.gradient(loss, tables)

    @tf.function
    def forward_backward():
        loss, grads = gradients()
        return loss + tf.add_n([tf.reduce_sum(g.values[:1]) for g in grads])

    @tf.function
    def train_step():
        loss, grads = gradients()
        wrapper.apply_gradients(zip(grads, tables))
        return loss

    # The step's exchange sizes, recorded from one eager forward.
    sizes = []
    original = communication.alltoall

    def recording(tensor, splits):
        received, received_splits = original(tensor, splits)
        sizes.append((np.asarray(splits), received_splits.numpy()))
        return received, received_splits

    communication.alltoall = recording
    try:
        gradients()
    finally:
        communication.alltoall = original
    (send_splits, recv_splits), = sizes  # one group: every table has dim 128
    send_keys = tf.zeros([int(send_splits.sum())], tf.int64)
    owner_rows = tf.zeros([int(recv_splits.sum()), DIM], tf.float32)
    send_tf, recv_tf = tf.constant(send_splits, tf.int32), tf.constant(recv_splits, tf.int32)

    @tf.function
    def exchange():
        keys, _ = communication.alltoall(send_keys, send_tf)
        rows = communication.alltoall_known(owner_rows, recv_tf, send_tf)
        grads = communication.alltoall_known(rows, send_tf, recv_tf)
        return tf.cast(keys[:1], tf.float32) + grads[:1, 0]

    result = interleaved({"step_ms": train_step, "fwd_bwd_ms": forward_backward,
                          "exchange_ms": exchange})
    result["update_ms"] = result["step_ms"] - result["fwd_bwd_ms"]
    result["lookup_ms"] = result["fwd_bwd_ms"] - result["exchange_ms"]
    result["ids_per_gpu"] = nnz * len(tables)
    result["keys_sent_per_gpu"] = int(send_splits.sum())
    result["exchange_mib_per_gpu"] = (8 * send_splits.sum() + 2 * 4 * DIM * recv_splits.sum()
                                      ) / 2 ** 20
    log("G6", json.dumps(result))
    return result


def g6x():
    workers = hvd.size()
    gpu = communication.exchange_device() or "/GPU:0"
    result = {}
    for mib in (16, 64):
        rows = mib * 2 ** 20 // (4 * DIM)
        splits = tf.constant([rows // workers] * workers, tf.int32)
        with tf.device(gpu):
            buffer = tf.random.uniform([rows // workers * workers, DIM])
        # CHAIN exchanges back to back in one tf.function (each sends the previous one's
        # output), as PyTorch's figure times a loop of launches: no per-call dispatch.
        def chained(exchange):
            def run(x, s):
                for _ in range(CHAIN):
                    x = exchange(x, s)
                return x
            return tf.function(run)

        sok_chain = chained(lambda x, s: communication.alltoall_known(x, s, s))
        hvd_chain = chained(lambda x, s: hvd.alltoall(x, splits=s)[0])
        sok_fn = lambda: sok_chain(buffer, splits)  # noqa: E731
        hvd_fn = lambda: hvd_chain(buffer, splits)  # noqa: E731
        same = bool(np.array_equal(sok_fn().numpy(), hvd_fn().numpy()))
        times = {name: ms / CHAIN for name, ms in
                 interleaved({"sok": sok_fn, "hvd": hvd_fn}, rounds=5, iters=3).items()}
        result[f"{mib}MiB"] = {
            "sok_ms": times["sok"], "hvd_ms": times["hvd"], "outputs_equal": same,
            "sok_gbps": mib * 2 ** 20 / times["sok"] / 1e6,
            "hvd_gbps": mib * 2 ** 20 / times["hvd"] / 1e6}
    log("G6x", json.dumps(result))
    return result


def main():
    hvd.init()
    gpus = tf.config.list_physical_devices("GPU")
    for gpu in gpus:
        tf.config.experimental.set_memory_growth(gpu, True)
    tf.config.set_visible_devices(gpus[hvd.local_rank()], "GPU")
    sok.init()
    log("exchange:", "NCCL (Sok>AllToAll)" if communication.exchange_device() else "hvd.alltoall")
    result = {"workers": hvd.size(), "G6x": g6x(), "G6": g6()}
    if hvd.rank() == 0:
        with open(os.path.join(provenance.out_dir(), "tf_multi_gpu_tf.json"), "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
