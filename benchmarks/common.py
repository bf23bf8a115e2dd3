"""Shared pieces of the CPU benchmarks: options, timing, machine description, result files."""
import argparse
import json
import os
import platform
import statistics
import sys
import time

import numpy as np
import tensorflow as tf

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import provenance  # noqa: E402

# The seed notebook's 26 vocabulary sizes (docs/benchmarks.md, C1).
NOTEBOOK_VOCAB = [203931, 18598, 14092, 7012, 18977, 4, 6385, 1245, 49, 186213, 71328, 67288,
                  11, 2168, 7338, 61, 4, 932, 15, 204515, 141526, 199433, 60919, 9137, 71, 34]


def int_options(doc, **defaults):
    """The command line's values: one integer option --NAME per keyword, with its default."""
    parser = argparse.ArgumentParser(description=doc)
    for name, default in defaults.items():
        parser.add_argument(f"--{name}", type=int, default=default)
    return parser.parse_args()


def interleaved_median_ms(fns, warmup=3, iterations=15):
    """Median wall time of each fn() in milliseconds, the fns called in turn each iteration,
    so that a drift in the machine's speed (large on shared VMs) reaches all of them alike."""
    for _ in range(warmup):
        for fn in fns:
            fn()
    times = [[] for _ in fns]
    for _ in range(iterations):
        for fn, samples in zip(fns, times):
            start = time.perf_counter()
            fn()
            samples.append((time.perf_counter() - start) * 1e3)
    return [statistics.median(samples) for samples in times]


def machine():
    return {
        "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "tensorflow": tf.__version__,
        "numpy": np.__version__,
    }


def write_result(name, payload):
    """Writes benchmarks/out/<name>.json (or $OUT's) with the machine and provenance."""
    payload = provenance.stamp(dict(payload, machine=machine()))
    path = os.path.join(provenance.out_dir(), name + ".json")
    with open(path, "w") as handle:
        json.dump(payload, handle, indent=2)
    return path


def markdown_table(header, rows):
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(cell) for cell in row) + " |" for row in rows]
    return "\n".join(lines)


def comparison(sok_ms, rival, rival_ms, digits=3, **notes):
    """One timing against a rival: both times, the rival's time over sok's, then `notes`."""
    return {"sok_ms": round(sok_ms, digits), f"{rival}_ms": round(rival_ms, digits),
            "speedup": round(rival_ms / sok_ms, 3), **notes}


def report(name, payload, header, rows):
    """Writes the result file, prints the table; returns the file's path."""
    path = write_result(name, payload)
    print(markdown_table(header, rows))
    return path


def report_comparisons(name, payload, rival):
    """report() of payload["results"], comparison() entries against `rival`: a row each."""
    rows = [[key, r["sok_ms"], r[f"{rival}_ms"], f"{r['speedup']:.2f}x"]
            for key, r in payload["results"].items()]
    path = report(name, payload, ["benchmark", "sok ms", f"{rival.upper()} ms", "speedup"], rows)
    print(f"written to {path}")
