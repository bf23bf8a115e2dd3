"""Shared by the GPU benchmarks: CUDA-event timing and where results go."""
import os
import statistics
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import provenance  # noqa: E402,F401  (the benchmarks stamp their results with it)


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
