"""Sets sok_script.py's observations under NVIDIA's SOK and under this package side by side:
every section's outcome, losses, table and optimizer-state contents, dump files and error
types. Differences this package makes on purpose are listed in EXPECTED with their reason
(docs/migrating_from_sok.md); any other difference fails. Writes the comparison as JSON.

    python3 tests/sok_dropin/compare.py OUT_DIR [REPORT_JSON]   (OUT_DIR holds sok.* and ours.*)
"""
import json
import os
import sys

import numpy as np

# (section prefix, field) -> why this package differs there on purpose
EXPECTED = {
    ("dynamic", "dump_files/sok_checkpoint.json"):
        "the manifest that makes a dump all-or-nothing (checkpoint.py)",
    ("sparse_read_and_evict", "evicted_counts"):
        "HierarchicalKV evicts within a full bucket of 128 slots, so SOK's hybrid table evicts "
        "some keys before it holds max_capacity; this package's table evicts only at "
        "max_capacity, the least recently used keys of the whole table",
    ("speed", "outcome"): "the speed sections ran under one package only",
}
TOLERANCE = dict(rtol=1e-5, atol=1e-6)


def load(folder, label):
    with open(os.path.join(folder, f"{label}.json")) as handle:
        report = json.load(handle)
    with np.load(os.path.join(folder, f"{label}.npz")) as data:
        return report["sections"], {name: data[name] for name in data.files}


def expected(section, field):
    return next((why for (prefix, name), why in EXPECTED.items()
                 if section.startswith(prefix) and field == name), None)


def compare_values(a, b):
    """'' when equal (floats within TOLERANCE), else a short description."""
    if isinstance(a, dict) and isinstance(b, dict):
        return "; ".join(f"{k}: {d}" for k in sorted(set(a) | set(b))
                         for d in [compare_values(a.get(k), b.get(k))] if d)
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b) and a and \
            all(isinstance(x, (int, float)) for x in a + b):
        close = np.allclose(a, b, **TOLERANCE)
        return "" if close else f"max difference {np.max(np.abs(np.subtract(a, b))):.3g}"
    return "" if a == b else f"{a!r} against {b!r}"[:200]


def compare_section(name, sok, ours, sok_arrays, our_arrays):
    differences = {}
    if sok["ok"] != ours["ok"]:
        differences["outcome"] = (f"SOK {'ok' if sok['ok'] else sok['error']}, this package "
                                  f"{'ok' if ours['ok'] else ours['error']}: "
                                  f"{sok.get('message', ours.get('message', ''))[:200]}")
        return differences
    for field in sorted((set(sok) | set(ours)) - {"ok", "seconds", "trace", "message"}):
        if field.endswith("_ms") or field in ("keys", "dimension", "batch", "tables", "rows"):
            continue  # speed figures are reported, not compared
        if field == "dump_files":
            for file in sorted(set(sok[field]) | set(ours[field])):
                a, b = sok[field].get(file), ours[field].get(file)
                if a is not None and b is not None:
                    a, b = dict(a), dict(b)
                    if not a.get("table"):  # SOK leaves the header's table name blank
                        b.pop("table", None)
                        a.pop("table", None)
                difference = compare_values(a, b)
                if difference:
                    differences[f"dump_files/{file}"] = difference
            continue
        difference = compare_values(sok.get(field), ours.get(field))
        if difference:
            differences[field] = difference
    for array in sorted(k for k in set(sok_arrays) | set(our_arrays) if k.startswith(name + "/")):
        a, b = sok_arrays.get(array), our_arrays.get(array)
        if a is None or b is None:
            differences[array] = "only under " + ("this package" if a is None else "SOK")
        elif a.shape != b.shape:
            differences[array] = f"shape {a.shape} against {b.shape}"
        elif not np.allclose(a.astype(np.float64), b.astype(np.float64), **TOLERANCE):
            differences[array] = (f"max difference "
                                  f"{np.max(np.abs(a.astype(np.float64) - b)):.3g}")
    return differences


def main():
    folder = sys.argv[1]
    target = sys.argv[2] if len(sys.argv) > 2 else os.path.join(folder, "sok_dropin.json")
    sok, sok_arrays = load(folder, "sok")
    ours, our_arrays = load(folder, "ours")
    result = {"sections": {}, "unexpected": 0, "expected": 0}
    for name in sorted(set(sok) | set(ours)):
        if name not in sok or name not in ours:
            result["sections"][name] = {"same": False,
                                        "unexpected": {"outcome": "ran under one package only"}}
            result["unexpected"] += 1
            continue
        differences = compare_section(name, sok[name], ours[name], sok_arrays, our_arrays)
        known = {f: expected(name, f) for f in differences if expected(name, f)}
        unknown = {f: d for f, d in differences.items() if f not in known}
        entry = {"same": not differences}
        if known:
            entry["expected"] = {f: f"{differences[f]} ({why})" for f, why in known.items()}
        if unknown:
            entry["unexpected"] = unknown
        for side, report in (("sok", sok[name]), ("ours", ours[name])):
            speed = {k: v for k, v in report.items() if k.endswith("_ms")}
            if speed:
                entry[f"{side}_speed"] = speed
        result["sections"][name] = entry
        result["unexpected"] += bool(unknown)
        result["expected"] += bool(known)
    with open(target, "w") as handle:
        json.dump(result, handle, indent=1)
    for name, entry in result["sections"].items():
        state = "same" if entry["same"] else "DIFFERENT" if "unexpected" in entry else "expected"
        print(f"{state:9s} {name} {json.dumps(entry.get('unexpected', ''))[:300]}")
    print(f"{len(result['sections'])} sections, {result['unexpected']} with unexpected "
          f"differences, {result['expected']} with expected ones -> {target}")
    return 1 if result["unexpected"] else 0


if __name__ == "__main__":
    sys.exit(main())
