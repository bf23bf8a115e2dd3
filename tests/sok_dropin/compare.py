"""Sets sok_script.py's observations under NVIDIA's SOK and under this package side by side:
every section's outcome, losses, table and optimizer-state contents, dump files and error
types. Differences this package makes on purpose are listed in EXPECTED with their reason
(docs/migrating_from_sok.md); any other difference fails. Writes the comparison as JSON.

    python3 tests/sok_dropin/compare.py OUT_DIR [REPORT_JSON]   (OUT_DIR holds sok.* and ours.*)
    python3 tests/sok_dropin/compare.py --classify REPORT_JSON  (EXPECTED applied again to a
                                                                 report's differences)
"""
import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
from benchmarks.provenance import stamp  # noqa: E402

# (section prefix, field) -> why this package differs there on purpose
EXPECTED = {
    ("dynamic", "dump_files/sok_checkpoint.json"):
        "the manifest that makes a dump all-or-nothing (checkpoint.py)",
    ("sparse_read_and_evict", "evicted_counts"):
        "HierarchicalKV evicts within a full bucket of 128 slots, so SOK's hybrid table evicts "
        "some keys before it holds max_capacity; this package's table evicts only at "
        "max_capacity, the least recently used keys of the whole table",
    ("errors/", "raises"):
        "this package checks arguments in Python and raises TypeError / ValueError naming the "
        "bad value; SOK raises what its ops or asserts raise (InvalidArgumentError, "
        "AbortedError, RuntimeError)",
    ("errors/", "outcome"):
        "SOK's process aborts on combiners=['max'], so the cases after it ran under this "
        "package only",
}
TOLERANCE = dict(rtol=1e-5, atol=1e-6)


def load(folder, label):
    with open(os.path.join(folder, f"{label}.json")) as handle:
        report = json.load(handle)
    with np.load(os.path.join(folder, f"{label}.npz")) as data:
        return report, {name: data[name] for name in data.files}


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


def classify(sections):
    """Sorts each section's differences into expected (with the reason) and unexpected."""
    totals = {"unexpected": 0, "expected": 0}
    for name, entry in sections.items():
        differences = entry.get("differences", {})
        entry["same"] = not differences
        entry["expected"] = {f: expected(name, f) for f in differences if expected(name, f)}
        entry["unexpected"] = sorted(f for f in differences if not expected(name, f))
        totals["unexpected"] += bool(entry["unexpected"])
        totals["expected"] += bool(entry["expected"])
    return totals


def write(result, target):
    result.update(classify(result["sections"]))
    with open(target, "w") as handle:
        json.dump(result, handle, indent=1)
    for name, entry in result["sections"].items():
        state = "same" if entry["same"] else "DIFFERENT" if entry["unexpected"] else "expected"
        shown = {f: entry["differences"][f] for f in entry["unexpected"]}
        print(f"{state:9s} {name} {json.dumps(shown)[:300] if shown else ''}")
    print(f"{len(result['sections'])} sections, {result['unexpected']} with unexpected "
          f"differences, {result['expected']} with expected ones -> {target}")
    return 1 if result["unexpected"] else 0


def main():
    if sys.argv[1] == "--classify":
        with open(sys.argv[2]) as handle:
            return write(json.load(handle), sys.argv[2])
    folder = sys.argv[1]
    target = sys.argv[2] if len(sys.argv) > 2 else os.path.join(folder, "sok_dropin.json")
    sok_report, sok_arrays = load(folder, "sok")
    our_report, our_arrays = load(folder, "ours")
    sok, ours = sok_report["sections"], our_report["sections"]
    result = stamp({"sections": {}}, made_by="bash tests/sok_dropin/on_device.sh")
    result["provenance"]["versions"].update(our_report.get("versions", {}))
    result["provenance"]["versions"]["NVIDIA SOK"] = "2.1.0"
    for name in sorted(set(sok) | set(ours)):
        if name not in sok or name not in ours:
            entry = {"differences": {"outcome": "ran under one package only"}}
        else:
            entry = {"differences": compare_section(name, sok[name], ours[name], sok_arrays,
                                                    our_arrays)}
        for side, report in (("sok", sok.get(name, {})), ("ours", ours.get(name, {}))):
            speed = {k: v for k, v in report.items() if k.endswith("_ms")}
            if speed:
                entry[f"{side}_speed"] = speed
        result["sections"][name] = entry
    return write(result, target)


if __name__ == "__main__":
    sys.exit(main())
