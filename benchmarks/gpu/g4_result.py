"""Turns g4_vs_hkv's printed figures into g4_vs_hkv.json: each op's sok / HierarchicalKV
ratio, the configuration, and the provenance of the run (g4_on_device.sh).

    python3 benchmarks/gpu/g4_result.py RAW_JSON OUT_JSON
"""
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import provenance  # noqa: E402

OPS = ("find", "find_or_insert", "insert_or_assign")


def with_ratios(raw):
    """raw[dim][load][op] = {"sok": x, "hkv": y}, each gaining "ratio": x / y."""
    for loads in raw.values():
        for figures in loads.values():
            for op in OPS:
                figures[op]["ratio"] = round(figures[op]["sok"] / figures[op]["hkv"], 3)
    return raw


def main(raw_path, out_path):
    with open(raw_path) as handle:
        raw = json.load(handle)
    payload = {
        "benchmark": "G4: GPU hash table against HierarchicalKV, same process, same keys, "
                     "keys/s/2^30",
        "config": {"keys_per_op": 1 << 20, "hit_fraction": 0.6,
                   "capacity": "128Mi keys (64Mi at dim 64)", "loads": [0.5, 0.75, 1.0],
                   "dims": [8, 32, 64], "repetitions": 50, "scores": "LRU"},
        "results": with_ratios(raw)}
    payload = provenance.stamp(payload, made_by="bash benchmarks/gpu/g4_on_device.sh")
    payload["device"] = payload["provenance"]["device"]
    if os.environ.get("NVCC_VERSION"):
        payload["provenance"]["versions"]["nvcc"] = os.environ["NVCC_VERSION"]
    with open(out_path, "w") as handle:
        json.dump(payload, handle, indent=1)
    for dim, loads in payload["results"].items():
        for load, figures in loads.items():
            print(dim, load, " ".join(f"{op} {figures[op]['ratio']}x" for op in OPS))


if __name__ == "__main__":
    main(*sys.argv[1:3])
