"""Regression runner: (optionally) runs the CPU benchmarks, then compares each figure of the
results in benchmarks/out/ (or --results) with benchmarks/baselines.json and prints improved /
degraded / balanced per figure (with --strict, exits 1 when a figure degraded beyond its
tolerance). Figures whose benchmark did not run (no result file) are listed as not run.

    python benchmarks/run.py                  # compare what the benchmarks wrote to benchmarks/out
    python benchmarks/run.py --run            # run C1-C6 first (tens of minutes on 2 cores)
    python benchmarks/run.py --results DIR    # compare another folder (a GPU script's $OUT)
    python benchmarks/run.py --publish        # copy benchmarks/out/* into benchmarks/results/

Publishing is a deliberate step: benchmarks/results/ holds the committed latest run of each
benchmark, and the comparison says whether a new run should replace it.
"""
import argparse
import json
import os
import shutil
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import provenance  # noqa: E402

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
    """[(name, baseline, current, verdict)]; verdict improved / degraded / balanced / not run.
    A figure is a speedup (higher is better) unless its spec says "better": "lower"."""
    rows = []
    for name, spec in baselines["figures"].items():
        current = figure(results_dir, spec)
        if current is None:
            rows.append((name, spec["baseline"], None, "not run"))
            continue
        change = current / spec["baseline"] - 1.0
        if spec.get("better") == "lower":
            change = spec["baseline"] / current - 1.0
        verdict = ("improved" if change > spec["tolerance"] else
                   "degraded" if change < -spec["tolerance"] else "balanced")
        rows.append((name, spec["baseline"], current, verdict))
    return rows


def publish(results_dir):
    """Copies every result file of results_dir into benchmarks/results/; returns their names."""
    names = sorted(n for n in os.listdir(results_dir) if n.endswith((".json", ".log")))
    for name in names:
        shutil.copyfile(os.path.join(results_dir, name), os.path.join(provenance.PUBLISHED, name))
    return names


def unit(spec):
    return " ms" if spec.get("better") == "lower" else "x"


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--run", action="store_true", help="run the CPU suite first")
    parser.add_argument("--results", default=os.environ.get("OUT") or provenance.DEFAULT_OUT,
                        help="the folder of result files to compare (default benchmarks/out)")
    parser.add_argument("--baselines", default=os.path.join(HERE, "baselines.json"))
    parser.add_argument("--strict", action="store_true",
                        help="exit 1 when a figure degraded beyond its tolerance")
    parser.add_argument("--publish", action="store_true",
                        help="copy the result files into benchmarks/results/ (to be committed)")
    args = parser.parse_args()
    if args.run:
        for script in SUITE:
            print(f"== {script}", flush=True)
            subprocess.run([sys.executable, os.path.join(HERE, script)], check=True,
                           env=dict(os.environ, OUT=args.results))
    if not os.path.isdir(args.results):
        sys.exit(f"no results folder {args.results}: run the benchmarks first (make bench)")
    if args.publish:
        names = publish(args.results)
        print(f"copied {len(names)} files into {provenance.PUBLISHED}: {', '.join(names)}")
        return 0
    with open(args.baselines) as handle:
        baselines = json.load(handle)
    rows = compare(baselines, args.results)
    print(f"results: {args.results}\n| figure | baseline | current | verdict |\n|---|---|---|---|")
    for (name, base, current, verdict), spec in zip(rows, baselines["figures"].values()):
        shown = "-" if current is None else f"{current:.3f}{unit(spec)}"
        print(f"| {name} | {base:.3f}{unit(spec)} | {shown} | {verdict} |")
    degraded = any(verdict == "degraded" for *_, verdict in rows)
    return 1 if args.strict and degraded else 0


if __name__ == "__main__":
    sys.exit(main())
