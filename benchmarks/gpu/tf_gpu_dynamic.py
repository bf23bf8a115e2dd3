"""Dynamic tables on the GPU inside TensorFlow (issue: TF on the GPU, part 2).

T4   one sok.DynamicVariable in GPU memory prefilled with 8Mi keys, dim 128, batch 65,536,
     one id per sample drawn from the present keys, SGD: eval (lookup_sparse with
     training=False: find only), forward (find-or-insert), train step (forward + backward +
     update), and the table's raw find (DynamicVariable.sparse_read(insert=False)); against
     a static sok.Variable of the same size trained the same way, in the same process, and
     the dynamicemb seed's published H100 figures for the same shape.
G1b  the same table with batch 1Mi.
T4z  T4 with Zipf(1.2) ids (T1's draw: the smallest indices hottest, the top key about 18%
     of the batch) over the present keys, the static table's rows drawn the same way.
Each is measured twice: with the benchmark's loss (a sum over the outputs: its gradient is a
[batch, 128] broadcast TensorFlow writes before the backward), and "noloss" as the published
figures and BENCHMARKS.md's floors count a step: the output's gradient is given (a fixed
random tensor, as torch's out.backward(grad)) and eval / forward return one element of the
output. The floors: forward >= 8B + U*D*4 + P*D*4 bytes, backward+update (SGD) >= 8B + P*D*4 +
2*U*D*4 bytes over the H100's device-to-device copy bandwidth (about 3.0 TB/s, BENCHMARKS.md;
B lookups, U unique keys, P output rows); `floor_fraction` = floor / measured.
A measurement runs `loop` steps inside one tf.function (a tf.range loop, as Keras'
steps_per_execution does), `iters` such calls back to back, waiting for the last: per-step
time with TensorFlow's per-call dispatch (about 0.3 ms on this machine) spread over the loop,
comparable to the GPU-event timings of the published figures. `*_call_ms` fields time one step
per tf.function call instead. Variants interleaved in rounds, medians reported. Writes
tf_gpu_dynamic.json to $OUT (merged with what else is there, e.g. G4).
"""
import json
import os
import sys
import time

import numpy as np
import tensorflow as tf

import sparse_operation_kit as sok

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from tf_gpu import looped, timed, zipf_ids  # noqa: E402

KEYS, DIM = 8 << 20, 128
DYNAMICEMB_H100 = {  # BENCHMARKS.md, G1a / G1b: dynamicemb v1 on an H100, ms
    "T4": {"eval_ms": 0.069, "fwd_ms": 0.196, "bwd_ms": 0.410, "train_ms": 0.606},
    "G1b": {"eval_ms": 0.601, "fwd_ms": 0.844, "bwd_ms": 1.616, "train_ms": 2.460},
}


def log(*args):
    print(*args, flush=True)


def interleaved(steps, loop, rounds=5, iters=5):
    fns = {name: looped(step, loop) for name, step in steps.items()}
    fns.update({name.replace("_ms", "_call_ms"): tf.function(step)
                for name, step in steps.items()})
    for fn in fns.values():
        fn().numpy()
    samples = {name: [] for name in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            per_call = timed(fn, iters)
            samples[name].append(per_call if "_call_" in name else per_call / loop)
    return {name: float(np.median(v)) for name, v in samples.items()}


def prefilled_table(present):
    table = sok.DynamicVariable(DIM, name="t4", initializer="uniform",
                                init_capacity=KEYS + (KEYS >> 3))
    for start in range(0, KEYS, 1 << 20):
        table.sparse_read(tf.constant(present[start:start + (1 << 20)]))
    assert int(table.size) == KEYS
    return table


def uniform_draw(rng, count):
    return rng.integers(0, KEYS, size=count)


def zipf_draw(rng, count):
    return zipf_ids(rng, KEYS, count)


def measure(table, static, present, batch, rng, draw=uniform_draw):
    keys = tf.constant(present[draw(rng, batch)])
    rows = tf.constant(draw(rng, batch), tf.int64)
    ragged = tf.RaggedTensor.from_tensor(keys[:, None])
    static_ragged = tf.RaggedTensor.from_tensor(rows[:, None])
    sok_opt = sok.OptimizerWrapper(tf.keras.optimizers.legacy.SGD(0.01))
    static_opt = sok.OptimizerWrapper(tf.keras.optimizers.legacy.SGD(0.01))

    def forward(training):
        return sok.lookup_sparse([table], [ragged], combiners=["sum"], training=training)[0]

    def train(tables, optimizer, fwd):
        def step():
            with tf.GradientTape() as tape:
                loss = tf.reduce_sum(fwd())
            optimizer.apply_gradients(zip(tape.gradient(loss, tables), tables))
            return loss
        return step

    # Correctness first: the lookup equals the table's own rows of those keys.
    np.testing.assert_array_equal(forward(False).numpy(),
                                  table.sparse_read(keys, insert=False).numpy())
    def forward_backward():
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(forward(True))
        return tf.reduce_sum(tape.gradient(loss, table).values)

    fixed_grad = tf.IndexedSlices(tf.ones([batch, DIM]), keys)
    apply_opt = sok.OptimizerWrapper(tf.keras.optimizers.legacy.SGD(1e-9))

    out_grad = tf.random.stateless_uniform([batch, DIM], [5, 6], -1.0, 1.0)
    noloss_opt = sok.OptimizerWrapper(tf.keras.optimizers.legacy.SGD(1e-6))
    static_noloss_opt = sok.OptimizerWrapper(tf.keras.optimizers.legacy.SGD(1e-6))

    def train_noloss(tables, optimizer, fwd):
        def step():
            with tf.GradientTape() as tape:
                out = fwd()
            grads = tape.gradient(out, tables, output_gradients=out_grad)
            optimizer.apply_gradients(zip(grads, tables))
            return out[0, 0]
        return step

    def static_forward():
        return sok.lookup_sparse([static], [static_ragged], combiners=["sum"])[0]

    def apply_only():
        apply_opt.apply_gradients([(fixed_grad, table)])
        return tf.constant(0.0)

    result = interleaved({
        "sok_find_ms": lambda: tf.reduce_sum(table.sparse_read(keys, insert=False)),
        "sok_fwd_bwd_ms": forward_backward,
        "sok_apply_ms": apply_only,
        "sok_eval_ms": lambda: tf.reduce_sum(forward(False)),
        "sok_fwd_ms": lambda: tf.reduce_sum(forward(True)),
        "sok_train_ms": train([table], sok_opt, lambda: forward(True)),
        "static_train_ms": train([static], static_opt, static_forward),
        "sok_eval_noloss_ms": lambda: forward(False)[0, 0],
        "sok_fwd_noloss_ms": lambda: forward(True)[0, 0],
        "sok_train_noloss_ms": train_noloss([table], noloss_opt, lambda: forward(True)),
        "static_train_noloss_ms": train_noloss([static], static_noloss_opt, static_forward),
    }, loop=20 if batch <= 65536 else 5)
    result.update(floors(keys.numpy(), result))
    assert int(table.size) == KEYS  # every key was present: nothing inserted
    return result


COPY_BYTES_PER_S = 3.0e12  # H100 device-to-device copy, bytes read + written (BENCHMARKS.md)


def floors(keys, result):
    """BENCHMARKS.md's bytes floors of this batch (SGD: no state) and the fraction of them the
    noloss steps reach."""
    b, u = len(keys), len(np.unique(keys))
    row = DIM * 4
    fwd = 8 * b + u * row + b * row
    bwd = 8 * b + b * row + 2 * u * row
    floor_ms = {"eval": fwd / COPY_BYTES_PER_S * 1e3, "fwd": fwd / COPY_BYTES_PER_S * 1e3,
                "train": (fwd + bwd) / COPY_BYTES_PER_S * 1e3}
    return {"unique_keys": u, "floor_ms": floor_ms,
            "floor_fraction": {k: v / result[f"sok_{k}_noloss_ms"] for k, v in floor_ms.items()}}


def main():
    out_dir = os.environ.get("OUT", os.path.join(os.path.dirname(__file__), "..", "results"))
    gpus = tf.config.list_physical_devices("GPU")
    if not gpus:
        sys.exit("no GPU visible to TensorFlow")
    sok.init(comm_tool="single")
    details = tf.config.experimental.get_device_details(gpus[0])
    rng = np.random.default_rng(7)
    present = np.unique(rng.integers(np.iinfo(np.int64).min, np.iinfo(np.int64).max, size=KEYS))
    assert len(present) == KEYS  # 8Mi draws from 2^64 values: no repeat in practice
    rng.shuffle(present)
    with tf.device("GPU:0"):
        table = prefilled_table(present)
        static = sok.Variable(tf.random.stateless_uniform([KEYS, DIM], [1, 2], -0.05, 0.05),
                              name="t4_static")
        results = {"device": details.get("device_name", "GPU")}
        for name, batch, draw in [("T4", 65536, uniform_draw), ("G1b", 1 << 20, uniform_draw),
                                  ("T4z", 65536, zipf_draw)]:
            result = measure(table, static, present, batch, rng, draw)
            if name in DYNAMICEMB_H100:
                result["dynamicemb_h100"] = DYNAMICEMB_H100[name]
            log(name, json.dumps(result))
            results[name] = result
    path = os.path.join(out_dir, "tf_gpu_dynamic.json")
    if os.path.exists(path):
        with open(path) as handle:
            previous = json.load(handle)
        previous.update(results)
        results = previous
    with open(path, "w") as handle:
        json.dump(results, handle, indent=1)


if __name__ == "__main__":
    main()
