"""Probe (diagnosis, not a benchmark of record): the host tier's share of a tiered table's
miss step, measured on the CPU alone with host_tier_step.cc (built here against the installed
TensorFlow's headers, as the op library is), in both row layouts of the host table: a row per
slot and pooled rows (a tiered table's host tier). Prints one JSON line per layout: the
milliseconds a step of the take of the misses (TakeOrAdmit) and of the insert of the rows
moving down.

    python3 host_tier_step.py [--fill 4000000] [--moved 182542] [--steps 10]
"""
import argparse
import os
import subprocess
import sys
import tempfile

import tensorflow as tf

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CORE = ["kit_src/core/hash_table/cpu_hash_table.cc", "kit_src/core/optimizers/rule_by_name.cc",
        "kit_src/core/optimizers/sum_duplicates.cc"]


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
    parser.add_argument("--steps", type=int, default=10)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        binary = os.path.join(folder, "host_tier_step")
        print("building host_tier_step", file=sys.stderr, flush=True)
        build(binary)
        for pooled in (0, 1):
            subprocess.run([binary, str(args.fill), str(args.moved), str(args.steps),
                            str(pooled)], check=True)


if __name__ == "__main__":
    main()
