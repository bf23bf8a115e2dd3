"""The TF-on-GPU benchmarks under two TensorFlow lines, side by side.

Usage: python benchmarks/gpu/tf_versions_table.py OLD_DIR NEW_DIR [OUT_JSON]
Each folder holds tf_gpu.json and tf_gpu_dynamic.json as `STAGES=bench
benchmarks/gpu/tf_on_device.sh` writes them under one TensorFlow line. Writes every timing of
both (T1-T3 and G5 from tf_gpu.py, T4 and G1 from tf_gpu_dynamic.py) with the ratio new / old,
and for this project's figures (`sok_*`, and `static_*`: its static table in tf_gpu_dynamic.py)
the geometric mean, least and most ratio, apart for the figures of one step a call (TensorFlow's
dispatch on the host counts) and those of steps in a loop inside one call (10 steps in
tf_gpu.py, 20 or 100 in tf_gpu_dynamic.py: the GPU's work counts). Prints a Markdown table of
the summary.
"""
import json
import math
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import provenance  # noqa: E402

FILES = ("tf_gpu.json", "tf_gpu_dynamic.json")


def one_step_a_call(file, figure):
    """tf_gpu.py times one step a call unless `_loop_`; tf_gpu_dynamic.py a loop unless
    `_call_`."""
    return "_call_" in figure if file == "tf_gpu_dynamic.json" else "_loop_" not in figure


def timings(old_dir, new_dir):
    """{workload: {figure: {"old", "new", "ratio", "per_call"}}} for figures both lines have."""
    rows, runs = {}, {}
    for file in FILES:
        old, new = (json.load(open(os.path.join(d, file))) for d in (old_dir, new_dir))
        runs[file] = (old["provenance"], new["provenance"])
        for workload, figures in old.items():
            if not isinstance(figures, dict) or workload == "provenance":
                continue
            for figure, value in figures.items():
                other = new.get(workload, {}).get(figure)
                timed = figure.endswith("_ms") and not figure.startswith("floor")
                if timed and all(isinstance(v, (int, float)) and v > 0 for v in (value, other)):
                    rows.setdefault(workload, {})[figure] = {
                        "old": value, "new": other, "ratio": round(other / value, 3),
                        "per_call": one_step_a_call(file, figure)}
    return rows, runs


def summary(rows):
    kinds = {"one step a call": [], "steps in a loop": []}
    for figures in rows.values():
        for figure, row in figures.items():
            if figure.startswith(("sok", "static")):
                kinds["one step a call" if row["per_call"] else "steps in a loop"].append(
                    row["ratio"])
    return {kind: {"figures": len(r), "geomean_ratio": round(math.exp(
                sum(map(math.log, r)) / len(r)), 3), "min_ratio": min(r), "max_ratio": max(r)}
            for kind, r in kinds.items() if r}


def main():
    if len(sys.argv) not in (3, 4):
        sys.exit("usage: python benchmarks/gpu/tf_versions_table.py OLD_DIR NEW_DIR [OUT_JSON]")
    old_dir, new_dir = sys.argv[1:3]
    out = sys.argv[3] if len(sys.argv) > 3 else os.path.join(provenance.out_dir(),
                                                             "tf_gpu_tf_versions.json")
    rows, runs = timings(old_dir, new_dir)
    old_made, new_made = runs[FILES[0]]
    old_tf, new_tf = old_made["versions"]["tensorflow"], new_made["versions"]["tensorflow"]
    payload = {
        "benchmark": "TF-on-GPU benchmarks (T1-T4, G1, G5) under two TensorFlow lines",
        "old": old_tf, "new": new_tf, "ratio": "new ms / old ms (below 1: the new line is faster)",
        "summary": summary(rows), "figures": rows,
        "provenance": {
            "device": f"{old_made['device']} ({old_tf}), {new_made['device']} ({new_tf})",
            "versions": {old_tf: old_made["versions"], new_tf: new_made["versions"]},
            "command": ("STAGES=bench bash benchmarks/gpu/tf_on_device.sh under each line, "
                        "then python benchmarks/gpu/tf_versions_table.py OLD_DIR NEW_DIR"),
            "date": new_made.get("date")}}
    with open(out, "w") as handle:
        json.dump(payload, handle, indent=1)
    print(f"| figures of this package | count | {new_tf} / {old_tf}: geometric mean | least | most |")
    print("|---|---|---|---|---|")
    for kind, row in payload["summary"].items():
        print(f"| {kind} | {row['figures']} | {row['geomean_ratio']:.2f}x | "
              f"{row['min_ratio']:.2f}x | {row['max_ratio']:.2f}x |")
    print("wrote", out)


if __name__ == "__main__":
    main()
