"""G4: the CUDA hash table (C ABI) on batches of 1Mi keys, 60% of them present: find,
find-or-insert, insert-or-assign at dim 8 (capacity 128Mi slots) and dim 64 (64Mi), the
table prefilled to load 0.5. Billions of key-values a second against HierarchicalKV's own
benchmark on the same H100 model (BENCHMARKS.md; HierarchicalKV is not run here)."""
import json
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__)))), "tests", "gpu"))
import capi  # noqa: E402
from gpu_timing import results_dir, time_ms  # noqa: E402

BATCH, HIT = 1 << 20, 0.6
WARMUP, ITERATIONS = 2, 10
HKV = {8: {"find": 3.52, "find_or_insert": 1.83, "insert_or_assign": 1.82},
       64: {"find": 2.97, "find_or_insert": 1.54, "insert_or_assign": 1.54}}
EMPTY = -(1 << 63)


def run(lib, dim, capacity):
    g = torch.Generator(device="cuda").manual_seed(dim)
    slots = torch.full((capacity,), EMPTY, dtype=torch.int64, device="cuda")
    values = torch.zeros(capacity, dim, device="cuda")
    counters = torch.zeros(2, dtype=torch.int64, device="cuda")
    table = (slots.data_ptr(), values.data_ptr(), counters.data_ptr(), capacity, dim, 0.9)
    stream = torch.cuda.current_stream().cuda_stream
    present = torch.randint(1, 1 << 62, (capacity // 2,), device="cuda", generator=g)
    chunk = torch.zeros(BATCH, dim, device="cuda")
    for start in range(0, len(present), BATCH):
        keys = present[start:start + BATCH]
        capi.check(lib.sok_gpu_table_upsert(*table, keys.data_ptr(), len(keys), chunk.data_ptr(),
                                            None, stream))
    fresh = {"next": 1 << 62}
    out = torch.empty(BATCH, dim, device="cuda")
    new_values = torch.randn(BATCH, dim, device="cuda", generator=g)

    def batch():
        hits = present[torch.randint(0, len(present), (int(BATCH * HIT),), device="cuda",
                                     generator=g)]
        misses = torch.arange(fresh["next"], fresh["next"] + BATCH - len(hits), device="cuda")
        fresh["next"] += len(misses)
        return torch.cat([hits, misses])

    # Every timed call gets its own batch, so its 40% misses are new keys to the table (the
    # upserts insert them); WARMUP + ITERATIONS batches per op keep the load near 0.5-0.65.
    def op(call):
        batches = [batch() for _ in range(WARMUP + ITERATIONS)]
        step = {"i": -1}

        def timed():
            step["i"] += 1
            call(batches[step["i"]])
        return timed

    def find(k):
        capi.check(lib.sok_gpu_table_find(*table, k.data_ptr(), BATCH, out.data_ptr(), None,
                                          stream))

    def find_or_insert(k):
        capi.check(lib.sok_gpu_table_upsert(*table, k.data_ptr(), BATCH, None, out.data_ptr(),
                                            stream))

    def insert_or_assign(k):
        capi.check(lib.sok_gpu_table_upsert(*table, k.data_ptr(), BATCH, new_values.data_ptr(),
                                            None, stream))

    results = {}
    for name, call in [("find", find), ("find_or_insert", find_or_insert),
                       ("insert_or_assign", insert_or_assign)]:
        ms = time_ms(op(call), warmup=WARMUP, iterations=ITERATIONS)
        results[name] = {"ms": round(ms, 4), "billion_kv_per_s": round(BATCH / ms / 1e6, 3),
                         "hkv_billion_kv_per_s": HKV[dim][name],
                         "vs_hkv": round(BATCH / ms / 1e6 / HKV[dim][name], 3)}
    results["load_after"] = round(int(counters[1]) / capacity, 3)
    del slots, values
    torch.cuda.empty_cache()
    return results


def main():
    lib = capi.load()
    results = {f"dim{dim}": run(lib, dim, capacity)
               for dim, capacity in [(8, 128 << 20), (64, 64 << 20)]}
    payload = {"benchmark": "G4 GPU hash table, 1Mi keys an op, load 0.5, vs HierarchicalKV's "
                            "published H100 figures",
               "device": torch.cuda.get_device_name(), "results": results,
               "target": ">= 1.2x HierarchicalKV on every op"}
    with open(os.path.join(results_dir(), "g4_hash_table.json"), "w") as handle:
        json.dump(payload, handle, indent=2)
    for dim_name, ops in results.items():
        print(f"| G4 {dim_name} | " + " | ".join(
            f"{op} {r['billion_kv_per_s']} B/s ({r['vs_hkv']}x HKV)" for op, r in ops.items()
            if isinstance(r, dict)) + f" | load after {ops['load_after']} |")


if __name__ == "__main__":
    main()
