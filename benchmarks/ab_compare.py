"""Compares the runs of one benchmark with two builds of the library, made in the same job
(benchmarks/gpu/ab_on_device.sh, or by hand): DIR holds base_<round>/ and new_<round>/
folders of result JSON. For every timing (a number under a key ending in `_ms`) in the files
both sides wrote: the median over each side's rounds and new / base. Writes
DIR/ab_compare.json and prints the timings, slowest ratio first; those more than --tolerance
slower are marked.

    python benchmarks/ab_compare.py DIR [--tolerance 0.03]
"""
import argparse
import glob
import json
import os
import statistics


def timings(value, prefix=""):
    """(path, milliseconds) of every number under a key ending in _ms."""
    if isinstance(value, dict):
        for key, inner in value.items():
            path = f"{prefix}/{key}" if prefix else key
            if isinstance(inner, (int, float)) and not isinstance(inner, bool):
                if key.endswith("_ms"):
                    yield path, float(inner)
            else:
                yield from timings(inner, path)


def side(directory, name, made=None):
    """{file/path: [ms per round]} of one side's rounds; `made` (a dict) receives the first
    file's provenance."""
    found = {}
    for round_dir in sorted(glob.glob(os.path.join(directory, f"{name}_*"))):
        if not os.path.isdir(round_dir):
            continue
        for path in sorted(glob.glob(os.path.join(round_dir, "*.json"))):
            with open(path) as handle:
                result = json.load(handle)
            if made is not None and not made and "provenance" in result:
                made.update(result["provenance"])
            stem = os.path.splitext(os.path.basename(path))[0]
            for key, ms in timings(result.get("results", result)):
                found.setdefault(f"{stem}:{key}", []).append(ms)
    return found


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("directory")
    parser.add_argument("--tolerance", type=float, default=0.03)
    args = parser.parse_args()
    made = {}
    base, new = side(args.directory, "base"), side(args.directory, "new", made)
    rows = []
    for key in sorted(set(base) & set(new)):
        b, n = statistics.median(base[key]), statistics.median(new[key])
        rows.append({"timing": key, "base_ms": b, "new_ms": n,
                     "new_over_base": n / b if b > 0 else float("nan"),
                     "rounds": [len(base[key]), len(new[key])]})
    rows.sort(key=lambda row: -row["new_over_base"])
    with open(os.path.join(args.directory, "ab_compare.json"), "w") as handle:
        json.dump({"tolerance": args.tolerance, "timings": rows,
                   "provenance": {"device": made.get("device"), "versions": made.get("versions"),
                                  "command": f"python benchmarks/ab_compare.py over runs of: "
                                             f"{made.get('command')}",
                                  "date": made.get("date")}}, handle, indent=1)
    slower = [row for row in rows if row["new_over_base"] > 1 + args.tolerance]
    for row in rows:
        mark = "  SLOWER" if row in slower else ""
        print(f"{row['timing']:60s} base {row['base_ms']:9.4f}  new {row['new_ms']:9.4f}  "
              f"new/base {row['new_over_base']:.3f}{mark}")
    print(f"{len(rows)} timings, {len(slower)} more than {args.tolerance:.0%} slower")


if __name__ == "__main__":
    main()
