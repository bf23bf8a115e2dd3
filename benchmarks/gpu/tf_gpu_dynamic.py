"""Dynamic tables on the GPU inside TensorFlow (T4, G1a, G1b, G1c; docs/benchmarks.md).

Every variant cycles 100 batches drawn once with a fixed seed (docs/benchmarks.md's method); index
i of a draw reads the i-th key inserted into the table and row i of the static table.
T4   one sok.DynamicVariable in GPU memory prefilled with 8Mi keys, dim 128, batch 65,536,
     one id per sample drawn uniformly from the present keys, SGD: eval (lookup_sparse with
     training=False: find only), forward (find-or-insert), train step (forward + backward +
     update), and the table's raw find (DynamicVariable.sparse_read(insert=False)); against
     a static sok.Variable of the same size trained the same way, in the same process, and
     the dynamicemb seed's published H100 figures for G1a's shape.
T4z  T4 with Zipf(1.2) ids (T1's draw: the smallest indices hottest, the top key about 18%
     of the batch).
G1a  T4 with docs/benchmarks.md's GPU-suite keys: dynamicemb's PowerLaw(1, N, alpha=1.05) sampler
     over the 8Mi keys (the first keys inserted hottest, as keys inserted when first seen
     are in training); G1a_perm: the same draws through a fixed random permutation (the hot
     keys' rows anywhere in the table).
G1b  G1a with batch 1Mi (G1b_perm likewise); G1b_uniform: T4's uniform draw at batch 1Mi.
G1c  G1b with Adam (legacy Keras Adam under OptimizerWrapper: m and v next to each row of a
     second table holding the same keys; the static table's lazy Adam keeps Keras' slots):
     the train steps only (eval and forward are G1b's).
Each is measured twice: as the published figures and docs/benchmarks.md's floors count a step
(`sok_eval_ms`, `sok_fwd_ms`, `sok_train_ms`, `static_train_ms`: the output's gradient is
given, a fixed random tensor as torch's out.backward(grad), and eval / forward return one
element of the output), and `*_sumloss_ms` with the benchmark's own loss (a sum over the
outputs: its gradient is a [batch, 128] broadcast TensorFlow writes before the backward). The floors: forward >= 8B + U*D*4 + P*D*4 bytes, backward+update (SGD) >= 8B + P*D*4 +
2*U*D*4 bytes over the H100's device-to-device copy bandwidth (about 3.0 TB/s, docs/benchmarks.md;
B lookups, U unique keys, P output rows); `floor_fraction` = floor / measured.
A measurement runs `loop` steps (100 at 65,536 keys, 20 at 1Mi; >= 20 warm-up steps first)
inside one tf.function (a tf.range loop, as Keras' steps_per_execution does), calls back to
back, waiting for the last: per-step time with TensorFlow's per-call dispatch (about 0.3 ms on
this machine) spread over the loop, comparable to the GPU-event timings of the published
figures. `*_call_ms` fields time one step per tf.function call instead. `empty_step_ms` is the
same loop with a step that only reads one id of its batch: TensorFlow's own cost of a loop
step, which bounds the small (65,536-key) steps from below whatever their kernels take. Variants interleaved in rounds, medians reported. Writes
tf_gpu_dynamic.json to $OUT (default benchmarks/out; merged with the variants already there).
"""
import argparse
import json
import os
import sys

import numpy as np
import tensorflow as tf

import sparse_operation_kit as sok

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from tf_gpu import (looped_over, one_id_lookup, provenance, start_on_gpu,  # noqa: E402
                    timed_call, train_step, zipf_ids)

KEYS, DIM = 8 << 20, 128
DYNAMICEMB_G1A = {"eval_ms": 0.069, "fwd_ms": 0.196, "bwd_ms": 0.410, "train_ms": 0.606}
DYNAMICEMB_H100 = {  # docs/benchmarks.md, G1a / G1b / G1c: dynamicemb v1 on an H100, ms
    "T4": DYNAMICEMB_G1A,  # T4 is compared (G1a's shape, uniform keys) with G1a's
    "G1a": DYNAMICEMB_G1A,
    "G1b": {"eval_ms": 0.601, "fwd_ms": 0.844, "bwd_ms": 1.616, "train_ms": 2.460},
    "G1c": {"train_ms": 2.67},
}


def sgd(learning_rate):
    return tf.keras.optimizers.legacy.SGD(learning_rate)


def adam(learning_rate):
    return tf.keras.optimizers.legacy.Adam(learning_rate)


def log(*args):
    print(*args, flush=True)


def interleaved(steps, loop, keys_all, rows_all, rounds=5, steps_a_sample=400, warmup_steps=20):
    """Medians of `rounds` interleaved rounds of each step(ids): ids one of the drawn batches
    (the static table's rows for "static_" steps, else the dynamic table's keys), taken in turn
    across calls. The batches are passed in, so a step computes no index (an index counted on
    the GPU cost 7 small ops a step, one from the host made the step a two-device function).
    "_ms": `loop` batches a call in a tf.range loop (as Keras' steps_per_execution), per step;
    "_call_ms": one batch a call."""
    batches = int(keys_all.shape[0])
    assert batches >= loop, f"{batches} batches cannot fill a loop of {loop}"

    def ids_of(name):
        return rows_all if name.startswith("static_") else keys_all

    def in_turn(fn, inputs):
        position = {"next": 0}

        def call():
            position["next"] += 1
            return fn(*inputs[position["next"] % len(inputs)])
        return call

    fns = {}
    for name, step in steps.items():
        ids = ids_of(name)
        windows = [(ids[w:w + loop],) for w in range(0, batches - loop + 1, loop)]
        fns[name] = (in_turn(looped_over(step, loop), windows), loop)
        fns[name.replace("_ms", "_call_ms")] = (
            in_turn(tf.function(step), [(ids[i],) for i in range(batches)]), 1)
    for fn, steps_a_call in fns.values():
        for _ in range(max(1, warmup_steps // steps_a_call)):
            fn().numpy()
    samples = {name: [] for name in fns}
    for _ in range(rounds):
        for name, (fn, steps_a_call) in fns.items():
            samples[name].append(timed_call(fn, max(1, steps_a_sample // steps_a_call))
                                 / steps_a_call)
    return {name: float(np.median(v)) for name, v in samples.items()}


def prefilled_table(present, name="t4", capacity=2 * KEYS):
    """A table (LRU, the default) of the KEYS present keys, inserted in their order."""
    table = sok.DynamicVariable(DIM, name=name, initializer="uniform", init_capacity=capacity)
    for start in range(0, KEYS, 1 << 20):
        table.sparse_read(tf.constant(present[start:start + (1 << 20)]))
    assert int(table.size[0]) == KEYS
    return table


def uniform_draw(rng, count):
    return rng.integers(0, KEYS, size=count)


def zipf_draw(rng, count):
    return zipf_ids(rng, KEYS, count)


def power_law_draw(rng, count, alpha=1.05):
    """docs/benchmarks.md's GPU-suite keys (dynamicemb's PowerLaw(1, N, alpha) sampler): indices in
    [1, N - 1], the smallest hottest."""
    x = rng.random(count)
    y = (x * (KEYS ** (1.0 - alpha) - 1.0) + 1.0) ** (1.0 / (1.0 - alpha))
    return np.minimum(y, KEYS - 1).astype(np.int64)


def measure(table, static, present, batch, rng, draw=uniform_draw, optimizer=sgd,
            state_floats=0, only=None, batches=100, permutation=None):
    """Times the variants (all, or those named in `only`) over `batches` batches drawn once
    and cycled: index i of a draw reads key present[i] of the table and row i of the static
    table (with `permutation`, key present[permutation[i]] and row permutation[i]), with
    `optimizer` (a legacy Keras optimizer of a learning rate) keeping `state_floats` floats
    of state a row."""
    drawn = draw(rng, batches * batch).reshape(batches, batch)
    if permutation is not None:
        drawn = permutation[drawn]
    keys_all = tf.constant(present[drawn])
    rows_all = tf.constant(drawn, tf.int64)
    sok_opt = sok.OptimizerWrapper(optimizer(0.01))
    static_opt = sok.OptimizerWrapper(optimizer(0.01))

    def forward(keys, training):
        return one_id_lookup(table, keys, training)

    def static_forward(rows):
        return one_id_lookup(static, rows)

    def train(tables, optimizer, fwd):
        return train_step(lambda ids: tf.reduce_sum(fwd(ids)), tables, optimizer)

    # Correctness first: the lookup equals the table's own rows of those keys.
    np.testing.assert_array_equal(forward(keys_all[0], False).numpy(),
                                  table.sparse_read(keys_all[0], insert=False).numpy())

    def forward_backward(keys):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(forward(keys, True))
        return tf.reduce_sum(tape.gradient(loss, table).values)

    ones = tf.ones([batch, DIM])
    apply_opt = sok.OptimizerWrapper(optimizer(1e-9))

    out_grad = tf.random.stateless_uniform([batch, DIM], [5, 6], -1.0, 1.0)
    given_opt = sok.OptimizerWrapper(optimizer(1e-6))
    static_given_opt = sok.OptimizerWrapper(optimizer(1e-6))

    def train_given_gradient(tables, optimizer, fwd):
        def step(ids):
            with tf.GradientTape() as tape:
                out = fwd(ids)
            grads = tape.gradient(out, tables, output_gradients=out_grad)
            optimizer.apply_gradients(zip(grads, tables))
            return out[0, 0]
        return step

    def apply_only(keys):
        apply_opt.apply_gradients([(tf.IndexedSlices(ones, keys), table)])
        return tf.constant(0.0)

    steps = {
        "sok_find_ms": lambda keys: tf.reduce_sum(table.sparse_read(keys, insert=False)),
        "sok_fwd_bwd_ms": forward_backward,
        "sok_apply_ms": apply_only,
        "sok_eval_sumloss_ms": lambda keys: tf.reduce_sum(forward(keys, False)),
        "sok_fwd_sumloss_ms": lambda keys: tf.reduce_sum(forward(keys, True)),
        "sok_train_sumloss_ms": train([table], sok_opt, lambda keys: forward(keys, True)),
        "static_train_sumloss_ms": train([static], static_opt, static_forward),
        "sok_eval_ms": lambda keys: forward(keys, False)[0, 0],
        "sok_fwd_ms": lambda keys: forward(keys, True)[0, 0],
        "sok_train_ms": train_given_gradient([table], given_opt,
                                             lambda keys: forward(keys, True)),
        "static_train_ms": train_given_gradient([static], static_given_opt, static_forward),
        "empty_step_ms": lambda keys: tf.cast(keys[0], tf.float32),
    }
    small = batch <= 65536
    result = interleaved({name: step for name, step in steps.items() if not only or name in only},
                         100 if small else 20, keys_all, rows_all,
                         steps_a_sample=400 if small else 100)
    result.update(floors(drawn[:10], result, state_floats))
    result["batches_cycled"] = batches
    assert int(table.size[0]) == KEYS  # every key was present: nothing inserted
    return result


COPY_BYTES_PER_S = 3.0e12  # H100 device-to-device copy, bytes read + written (docs/benchmarks.md)


def floors(keys, result, state_floats=0):
    """docs/benchmarks.md's bytes floors of batches `keys` ([n, B]; U their mean unique count),
    rows with `state_floats` floats of optimizer state (SGD 0, Adam 2 * DIM), and the fraction
    of them the steps as the published figures count them reach."""
    b = keys.shape[1]
    u = float(np.mean([len(np.unique(k)) for k in keys]))
    row = DIM * 4
    fwd = 8 * b + u * row + b * row
    bwd = 8 * b + b * row + 2 * u * (DIM + state_floats) * 4
    floor_ms = {"eval": fwd / COPY_BYTES_PER_S * 1e3, "fwd": fwd / COPY_BYTES_PER_S * 1e3,
                "train": (fwd + bwd) / COPY_BYTES_PER_S * 1e3}
    return {"unique_keys": u, "floor_ms": floor_ms,
            "floor_fraction": {k: v / result[f"sok_{k}_ms"] for k, v in floor_ms.items()
                               if f"sok_{k}_ms" in result}}


VARIANTS = {  # name: (batch, draw, permuted)
    "T4": (65536, uniform_draw, False), "G1b_uniform": (1 << 20, uniform_draw, False),
    "T4z": (65536, zipf_draw, False), "G1a": (65536, power_law_draw, False),
    "G1a_perm": (65536, power_law_draw, True), "G1b": (1 << 20, power_law_draw, False),
    "G1b_perm": (1 << 20, power_law_draw, True),
}


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--capacity", type=int, default=2 * KEYS,
                        help="the tables' init_capacity (rows); with room for fewer new keys "
                             "than a few batches, a find-or-insert waits to count its new keys")
    parser.add_argument("--variants", default=",".join(list(VARIANTS) + ["G1c"]))
    args = parser.parse_args()
    chosen = args.variants.split(",")
    out_dir = provenance.out_dir()
    device = start_on_gpu()
    rng = np.random.default_rng(7)
    present = np.unique(rng.integers(np.iinfo(np.int64).min, np.iinfo(np.int64).max, size=KEYS))
    assert len(present) == KEYS  # 8Mi draws from 2^64 values: no repeat in practice
    rng.shuffle(present)
    with tf.device("GPU:0"):
        table = prefilled_table(present, capacity=args.capacity)
        static = sok.Variable(tf.random.stateless_uniform([KEYS, DIM], [1, 2], -0.05, 0.05),
                              name="t4_static")
        results = {"device": device,
                   "table": {"keys": KEYS, "init_capacity": args.capacity, "evict": "lru"}}
        permutation = rng.permutation(KEYS)
        for name in chosen:
            if name not in VARIANTS:
                continue
            batch, draw, permuted = VARIANTS[name]
            result = measure(table, static, present, batch, rng, draw,
                             permutation=permutation if permuted else None)
            result["keys"] = draw.__name__.replace("_draw", "") + (", permuted" if permuted else "")
            if name in DYNAMICEMB_H100:
                result["dynamicemb_h100"] = DYNAMICEMB_H100[name]
            log(name, json.dumps(result))
            results[name] = result
        if "G1c" in chosen:
            adam_table = prefilled_table(present, name="g1c", capacity=args.capacity)
            result = measure(adam_table, static, present, 1 << 20, rng, power_law_draw,
                             optimizer=adam, state_floats=2 * DIM,
                             only={"sok_train_ms", "sok_train_sumloss_ms", "static_train_ms"})
            result["keys"] = "power_law"
            result["dynamicemb_h100"] = DYNAMICEMB_H100["G1c"]
            log("G1c", json.dumps(result))
            results["G1c"] = result
    path = os.path.join(out_dir, "tf_gpu_dynamic.json")
    if os.path.exists(path):
        with open(path) as handle:
            previous = json.load(handle)
        previous.update(results)
        results = previous
    with open(path, "w") as handle:
        json.dump(provenance.stamp(results, results["device"]), handle, indent=1)


if __name__ == "__main__":
    main()
