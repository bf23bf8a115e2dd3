"""Tiered dynamic tables on the GPU (T6a-T6e; docs/benchmarks.md): more rows than the HBM
budget holds.

One sok.DynamicVariable(var_type="hybrid", hbm_budget_bytes=...) prefilled with `keys` keys
(dim 128, uniform rows written by sok.assign), the keys of each
batch drawn by docs/benchmarks.md's power-law sampler (alpha 1.05, the first keys hottest),
100 batches drawn once and cycled, one id a sample, passed to the step as its argument.
Measured per step: eval (lookup_sparse with training=False: find only), forward (the training
lookup: find-or-insert, which brings the batch's rows into the hot tier) and train (forward,
a sum loss, its gradient and the optimizer's update), in a tf.range loop of `loop` steps a
call (as Keras' steps_per_execution) and one step a call, each form timed over whole passes of
the 100 batches in order, the forms taking turns pass by pass (so every form meets the
cycle's hit rate); medians of `rounds` rounds, after `first_cycle`: one pass over the 100
batches right after the prefill, where every row starts in host memory (its train time, hit
rate and rows moved, reported on their own).
`hit_rate` is the share of the training lookups' ids whose rows were in the hot tier already
(sok.tier_counts) while the loop form's train passes ran (`moved_by_form`: the same for the
other forms whose lookups move rows); `rows_moved_per_step` the rows copied up and
down, `host_gbps` the bytes those rows (value and state) moved a second, `pcie_floor_ms` the
time those rows take at PCIe 5.0 x16's 64 GB/s each way and `pcie_floor_fraction` its share of
the step, and `<stage>_ms_per_step` the training lookup's time a step and its miss path's
stages' (sok.tier_counts' seconds: take_up, move_down, move_up), with `write_back_ms_per_step`
the host inserts of the rows moved down (beside the step) and `write_back_wait_ms_per_step`
the calls' waits for them. Where the table fits the GPU
whole, the same steps on the one-tier GPU table give `hbm_train_ms` / `hbm_train_call_ms` and
`slowdown` / `slowdown_call`.
dynamicemb's published H100 figures of the same shapes (`caching` on) stand beside each row.
Writes tf_tiered.json to $OUT (default benchmarks/out; merged with the variants already there).
"""
import argparse
import json
import os
import sys
import time

import numpy as np
import tensorflow as tf

import sparse_operation_kit as sok

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from tf_gpu import looped_over, one_id_lookup, provenance, start_on_gpu  # noqa: E402

DIM = 128
GIB = 1 << 30
VARIANTS = {  # keys, HBM budget (GiB), batch, optimizer
    "T6a": (64 << 20, 4, 65536, "sgd"),
    "T6b": (64 << 20, 12, 65536, "adam"),
    "T6c": (64 << 20, 4, 1 << 20, "sgd"),
    "T6d": (64 << 20, 12, 1 << 20, "adam"),
    "T6e": (8 << 20, 4, 65536, "sgd"),
}
DYNAMICEMB_H100 = {  # docs/benchmarks.md: dynamicemb caching, H100, ms
    "T6a": {"train_ms": 1.415, "eval_ms": 0.242},
    "T6b": {"train_ms": 1.601, "eval_ms": 0.243},
    "T6c": {"train_ms": 10.69, "eval_ms": 3.19},
    "T6d": {"train_ms": 11.48, "eval_ms": 3.30},
    "T6e": {"train_ms": 1.281, "eval_ms": 0.240},
}
# sok.tier_counts' *_seconds
STAGES = ("lookup", "take_up", "move_down", "move_up", "write_back", "write_back_wait")
PCIE_GBPS = 64.0  # PCIe 5.0 x16 between host and an H100 / H200, GB/s each way
OPTIMIZERS = {"sgd": (lambda: tf.keras.optimizers.legacy.SGD(0.01), 0),
              "adam": (lambda: tf.keras.optimizers.legacy.Adam(0.001), 2)}


def log(*args):
    print(*args, flush=True)


def power_law(rng, keys, count, alpha=1.05):
    """docs/benchmarks.md's sampler: indices in [1, keys - 1], the smallest hottest."""
    x = rng.random(count)
    y = (x * (keys ** (1.0 - alpha) - 1.0) + 1.0) ** (1.0 / (1.0 - alpha))
    return np.minimum(y, keys - 1).astype(np.int64)


def key_of(index):
    """The table's key for an index: spread over the int64 range, as hashed ids are."""
    return (index * np.int64(-7046029254386353131)).astype(np.int64)


def prefilled(keys, name, **config):
    table = sok.DynamicVariable(DIM, name=name, initializer="uniform", max_capacity=2 * keys,
                                **config)
    rng = np.random.default_rng(3)
    chunk = 1 << 20
    for start in range(0, keys, chunk):
        index = np.arange(start, min(start + chunk, keys), dtype=np.int64)
        rows = rng.random((len(index), DIM), dtype=np.float32)  # float32 draws: 10x quicker
        rows -= 0.5
        rows *= 0.1  # uniform in [-0.05, 0.05)
        table.assign(tf.constant(key_of(index)), rows)
    assert int(table.size[0]) == keys
    return table


def steps_of(table, optimizer):
    def train(keys):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(one_id_lookup(table, keys, True))
        optimizer.apply_gradients([(tape.gradient(loss, table), table)])
        return loss

    return {"eval_ms": lambda keys: one_id_lookup(table, keys)[0, 0],
            "fwd_ms": lambda keys: one_id_lookup(table, keys, True)[0, 0],
            "train_ms": train}


def timed_passes(steps, batches, loop, rounds, table=None, row_bytes=0):
    """Medians over `rounds` rounds of each step's time a step, each form timed over a whole
    pass of the batches in order, the forms taking turns pass by pass: "<name>" `loop` steps a
    call in a tf.range loop (consecutive windows of batches), "<name>_call" one step a call.
    A whole pass each gives every form the cycle's hit rate: no form revisits batches another
    has just brought up. With `table` (tiered), also each form's movement over its passes
    (forms whose lookups count: the training lookups)."""
    count = int(batches.shape[0]) // loop * loop
    singles = [batches[k] for k in range(count)]
    windows = [batches[w:w + loop] for w in range(0, count, loop)]
    forms = {}
    for name, step in steps.items():
        forms[name] = (looped_over(step, loop), windows)
        forms[name.replace("_ms", "_call_ms")] = (tf.function(step), singles)
    for run, inputs in forms.values():  # traced before any timed pass
        run(inputs[0]).numpy()
    samples = {name: [] for name in forms}
    changes = {name: [] for name in forms}
    for _ in range(rounds):
        for name, (run, inputs) in forms.items():
            before = sok.tier_counts(table) if table is not None else None
            start = time.perf_counter()
            for one_input in inputs:
                result = run(one_input)
            result.numpy()
            samples[name].append((time.perf_counter() - start) * 1e3 / count)
            if table is not None:
                changes[name].append((before, sok.tier_counts(table)))
    timings = {name: float(np.median(v)) for name, v in samples.items()}
    moved = {}
    for name, pairs in changes.items():
        if not pairs:
            continue
        zero = {key: 0 for key in pairs[0][0]}
        summed = {key: sum(after[key] - before[key] for before, after in pairs) for key in zero}
        if summed["ids_looked_up"] > 0:
            moved[name] = movement(zero, summed, int(batches.shape[1]), row_bytes, timings[name])
    return timings, moved


def movement(before, after, batch, row_bytes, step_ms):
    """Hit rate and rows moved a step between two sok.tier_counts readings, and the PCIe floor
    of those rows: rows up and rows down cross the link in opposite directions, so the floor
    is the larger direction's bytes at PCIE_GBPS; `pcie_floor_fraction` is floor over step."""
    looked_up = after["ids_looked_up"] - before["ids_looked_up"]
    steps = max(1.0, looked_up / batch)
    up = (after["moved_up"] - before["moved_up"]) / steps
    down = (after["moved_down"] - before["moved_down"]) / steps
    floor_ms = max(up, down) * row_bytes / PCIE_GBPS / 1e6
    result = {"steps": steps,
              "hit_rate": (after["hot_hits"] - before["hot_hits"]) / max(1, looked_up),
              "rows_moved_per_step": up + down,
              "rows_up_per_step": up, "rows_down_per_step": down,
              "host_gbps": (up + down) * row_bytes / step_ms / 1e6,
              "pcie_floor_ms": floor_ms, "pcie_floor_fraction": floor_ms / step_ms}
    for stage in STAGES:  # the training lookup's time a step, and its miss path's stages
        seconds = after[f"{stage}_seconds"] - before[f"{stage}_seconds"]
        result[f"{stage}_ms_per_step"] = seconds * 1e3 / steps
    return result


def first_cycle(table, train, batches, row_bytes):
    """The first pass over the batches, one step a call, right after the prefill: every row
    starts in host memory, so this is where rows move up (the first call, which traces, is
    left out of the time)."""
    step = tf.function(train)
    step(batches[0]).numpy()
    before = sok.tier_counts(table)
    start = time.perf_counter()
    for k in range(1, int(batches.shape[0])):
        loss = step(batches[k])
    loss.numpy()
    step_ms = (time.perf_counter() - start) * 1e3 / (int(batches.shape[0]) - 1)
    result = {"train_ms": step_ms}
    result.update(movement(before, sok.tier_counts(table), int(batches.shape[1]), row_bytes,
                           step_ms))
    return result


def measure(name, keys, budget_gib, batch, optimizer_name, rng, loop, rounds, with_hbm,
            keys_dir):
    make_optimizer, state_floats = OPTIMIZERS[optimizer_name]
    budget = int(budget_gib * GIB)
    drawn = key_of(power_law(rng, keys, 100 * batch).reshape(100, batch))
    if keys_dir:  # the same batches for HierarchicalKV (t6_hkv_hybrid.cu)
        drawn.tofile(os.path.join(keys_dir, f"{name}_keys.bin"))
    batches = tf.constant(drawn)
    result = {"keys": keys, "hbm_budget_bytes": budget, "batch": batch,
              "optimizer": optimizer_name, "batches_cycled": 100,
              "distinct_keys_per_batch": float(np.mean([len(np.unique(b)) for b in
                                                        batches.numpy()[:10]]))}
    table = prefilled(keys, f"{name}_tiered", var_type="hybrid", hbm_budget_bytes=budget)
    steps = steps_of(table, sok.OptimizerWrapper(make_optimizer()))
    row_bytes = DIM * 4 * (1 + state_floats)
    result["first_cycle"] = first_cycle(table, steps["train_ms"], batches, row_bytes)
    log(name, "first cycle", json.dumps(result["first_cycle"]))
    timings, moved = timed_passes(steps, batches, loop, rounds, table, row_bytes)
    result.update(moved.pop("train_ms"))  # the loop form's training steps
    result["moved_by_form"] = moved  # the other forms whose lookups move rows
    result.update(timings)
    result["tier_counts"] = sok.tier_counts(table)
    del steps, table
    if with_hbm:
        hbm = prefilled(keys, f"{name}_hbm")
        hbm_steps = steps_of(hbm, sok.OptimizerWrapper(make_optimizer()))
        hbm_timings, _ = timed_passes({"train_ms": hbm_steps["train_ms"]}, batches, loop,
                                      rounds)
        result["hbm_train_ms"] = hbm_timings["train_ms"]
        result["hbm_train_call_ms"] = hbm_timings["train_call_ms"]
        result["slowdown"] = result["train_ms"] / result["hbm_train_ms"]
        result["slowdown_call"] = result["train_call_ms"] / result["hbm_train_call_ms"]
        del hbm_steps, hbm
    result["dynamicemb_h100"] = DYNAMICEMB_H100.get(name)
    return result


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--variants", default="T6e,T6a")
    parser.add_argument("--scale", type=float, default=1.0,
                        help="keys and budget multiplied by this (a quick run: 0.125)")
    parser.add_argument("--loop", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--with-hbm", default="T6e,T6a",
                        help="variants also measured on the one-tier GPU table")
    parser.add_argument("--keys-dir", default="",
                        help="write each variant's batches there (<name>_keys.bin, int64)")
    parser.add_argument("--merge-hkv", default="",
                        help="only merge t6_hkv_hybrid's <name>_hkv.json files from this folder")
    args = parser.parse_args()
    out_dir = provenance.out_dir()
    if args.merge_hkv:
        return merge_hkv(args.merge_hkv, out_dir)
    results = {"device": start_on_gpu(), "scale": args.scale, "dim": DIM}
    rng = np.random.default_rng(11)
    with tf.device("GPU:0"):
        for name in args.variants.split(","):
            keys, budget_gib, batch, optimizer_name = VARIANTS[name]
            result = measure(name, int(keys * args.scale), budget_gib * args.scale, batch,
                             optimizer_name, rng, args.loop, args.rounds,
                             name in args.with_hbm.split(","), args.keys_dir)
            log(name, json.dumps(result))
            results[name] = result
            save(results, out_dir)  # after each variant: a long run keeps what it measured


def merge_hkv(folder, out_dir):
    """Adds HierarchicalKV's hybrid-mode figures on the same keys (t6_hkv_hybrid.cu) to
    each variant measured, with this table's speed over it ("vs_hkv_hybrid": HierarchicalKV's
    time over this table's, a step of the loop form)."""
    with open(os.path.join(out_dir, "tf_tiered.json")) as handle:
        results = json.load(handle)
    for name in VARIANTS:
        path = os.path.join(folder, f"{name}_hkv.json")
        if name not in results or not os.path.exists(path):
            continue
        with open(path) as handle:
            hkv = json.load(handle)
        results[name]["hkv_hybrid"] = hkv
        results[name]["vs_hkv_hybrid"] = {
            step: round(hkv[f"{step}_ms"] / results[name][f"{step}_ms"], 3)
            for step in ("train", "eval")}
        log(name, "HierarchicalKV hybrid", json.dumps(results[name]["vs_hkv_hybrid"]))
    made_by = results.get("provenance", {}).get("command", "")
    save(results, out_dir, made_by + "; HierarchicalKV: benchmarks/gpu/t6_hkv_hybrid.cu "
         "(bash benchmarks/gpu/t6_hkv_on_device.sh)")


def save(results, out_dir, made_by=None):
    path = os.path.join(out_dir, "tf_tiered.json")
    merged = dict(results)
    if os.path.exists(path):
        with open(path) as handle:
            merged = json.load(handle)
        merged.update(results)
    with open(path, "w") as handle:
        json.dump(provenance.stamp(merged, merged["device"], made_by), handle, indent=1)


if __name__ == "__main__":
    main()
