"""The host table's two row layouts on a tiered table's host-tier work, on the CPU alone:
a row per slot (the host table) against pooled rows (a tiered table's host tier). Builds
host_tier_step.cc against the installed TensorFlow's headers, as the op library is, and runs
it for each row width and layout, the layouts alternating round by round: a find of a step's
missing keys (an eval step's read of host rows), their take up (TakeOrAdmit) and the insert of
as many rows moving down (InsertNew). Writes the medians and pooled / per-slot ratios to
host_tier_step.json in $OUT (else benchmarks/out).

    python benchmarks/diagnosis/host_tier_step.py [--fill 4000000] [--moved 182542]
        [--dims 16,128] [--steps 6] [--rounds 3]
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

import tensorflow as tf

BENCHMARKS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, BENCHMARKS)
import provenance  # noqa: E402

ROOT = os.path.dirname(BENCHMARKS)
CORE = ["kit_src/core/hash_table/cpu_hash_table.cc", "kit_src/core/optimizers/rule_by_name.cc",
        "kit_src/core/optimizers/sum_duplicates.cc"]
LAYOUTS = {"per_slot": "0", "pooled": "1"}


def build(binary):
    source = os.path.join(os.path.dirname(os.path.abspath(__file__)), "host_tier_step.cc")
    command = (["g++", "-O3", "-march=x86-64-v3", "-I" + ROOT, source] +
               [os.path.join(ROOT, path) for path in CORE] + tf.sysconfig.get_compile_flags() +
               tf.sysconfig.get_link_flags() + ["-Wl,-rpath," + tf.sysconfig.get_lib(),
                                                "-lpthread", "-o", binary])
    subprocess.run(command, check=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fill", type=int, default=4_000_000)
    parser.add_argument("--moved", type=int, default=182_542)
    parser.add_argument("--dims", default="16,128")
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    runs = {}  # (dim, layout) -> {pass: [ms per round]}
    with tempfile.TemporaryDirectory() as folder:
        binary = os.path.join(folder, "host_tier_step")
        print("building host_tier_step", flush=True)
        build(binary)
        for dim in [int(d) for d in args.dims.split(",")]:
            for round_ in range(args.rounds):
                order = list(LAYOUTS) if round_ % 2 == 0 else list(reversed(LAYOUTS))
                for layout in order:
                    line = subprocess.run(
                        [binary, str(args.fill), str(args.moved), str(args.steps),
                         LAYOUTS[layout], str(dim)], check=True, capture_output=True,
                        text=True).stdout
                    print(f"dim {dim} round {round_} {layout}: {line.strip()}", flush=True)
                    for name, ms in json.loads(line).items():
                        runs.setdefault((dim, layout), {}).setdefault(name, []).append(ms)
    results = {}
    for (dim, layout), passes in runs.items():
        results.setdefault(f"dim{dim}", {})[layout] = {
            name: statistics.median(ms) for name, ms in passes.items()}
    for by_layout in results.values():
        by_layout["pooled_over_per_slot"] = {
            name.replace("_ms", ""): by_layout["pooled"][name] / by_layout["per_slot"][name]
            for name in by_layout["pooled"]}
    payload = provenance.stamp({
        "what": f"host tier of a tiered table on the CPU alone: {args.fill} keys held, "
                f"{args.moved} distinct keys up and as many rows down a step, median of "
                f"{args.rounds} rounds of {args.steps} steps, layouts alternating",
        "threads": os.cpu_count(), "results": results})
    path = os.path.join(provenance.out_dir(), "host_tier_step.json")
    with open(path, "w") as handle:
        json.dump(payload, handle, indent=1)
    print(json.dumps(results, indent=1))
    print("wrote", path)


if __name__ == "__main__":
    main()
