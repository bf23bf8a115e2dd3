"""Shared by the GPU benchmarks: CUDA-event timing, batches in turn, and where results go."""
import json
import os
import statistics
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import provenance  # noqa: E402


def time_ms(fn, warmup=20, iterations=100):
    """Median milliseconds of fn() between CUDA events, after warm-up."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(iterations):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def results_dir():
    """$OUT, else benchmarks/out (untracked)."""
    return provenance.out_dir()


def cycler(batches):
    """A function returning the next of `batches` at each call, round and round (the timed
    functions of a benchmark share one)."""
    step = {"i": 0}

    def next_batch():
        step["i"] += 1
        return batches[step["i"] % len(batches)]
    return next_batch


def write_result(name, payload):
    """Writes payload, stamped with its provenance on payload["device"], to the results
    folder as <name>.json."""
    with open(os.path.join(results_dir(), name + ".json"), "w") as handle:
        json.dump(provenance.stamp(payload, payload["device"]), handle, indent=2)
