"""Shared by the GPU benchmarks: CUDA-event timing and where results go."""
import os
import statistics

import torch


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
    """$OUT on the device machine, else benchmarks/results."""
    return os.environ.get("OUT") or os.path.join(
        os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "results")
