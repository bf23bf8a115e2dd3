"""Regression runner: (optionally) runs the CPU benchmarks, then compares each figure in
benchmarks/results/*.json with benchmarks/baselines.json and prints improved / degraded /
balanced per figure. Exits 1 when a figure degraded beyond its tolerance.

    python benchmarks/run.py            # compare the results already written
    python benchmarks/run.py --run      # run C1-C6 first (several minutes)
"""
import argparse
import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
SUITE = ["cpu/c1_fused_lookup.py", "cpu/c2_c3_hash_table.py", "cpu/c4_dynamic_training.py",
         "cpu/c5_interaction.py", "cpu/c6_dlrm.py"]


def figure(results_dir, spec):
    path = os.path.join(results_dir, spec["file"] + ".json")
    if not os.path.exists(path):
        return None
    with open(path) as handle:
        value = json.load(handle)
    for key in spec["path"]:
        value = value[key]
    return float(value)


def compare(baselines, results_dir):
    """[(name, baseline, current, verdict)]; verdict improved / degraded / balanced / missing."""
    rows = []
    for name, spec in baselines["figures"].items():
        current = figure(results_dir, spec)
        if current is None:
            rows.append((name, spec["baseline"], None, "missing"))
            continue
        change = current / spec["baseline"] - 1.0
        verdict = ("improved" if change > spec["tolerance"] else
                   "degraded" if change < -spec["tolerance"] else "balanced")
        rows.append((name, spec["baseline"], current, verdict))
    return rows


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--run", action="store_true", help="run the CPU suite first")
    parser.add_argument("--results", default=os.path.join(HERE, "results"))
    parser.add_argument("--baselines", default=os.path.join(HERE, "baselines.json"))
    args = parser.parse_args()
    if args.run:
        for script in SUITE:
            print(f"== {script}", flush=True)
            subprocess.run([sys.executable, os.path.join(HERE, script)], check=True)
    with open(args.baselines) as handle:
        baselines = json.load(handle)
    rows = compare(baselines, args.results)
    print("| figure | baseline | current | verdict |\n|---|---|---|---|")
    for name, base, current, verdict in rows:
        shown = "-" if current is None else f"{current:.2f}x"
        print(f"| {name} | {base:.2f}x | {shown} | {verdict} |")
    return 1 if any(verdict == "degraded" for *_, verdict in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
