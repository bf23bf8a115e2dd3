"""FBGEMM's table-batched embedding (TBE, the kernel under TorchRec) on the workloads of
tbe_workloads.py, timed as its users run it: eagerly, one step a Python call, wall time of
`iters` steps after warm-up. Forward is `emb(indices, offsets).sum()`; train adds the backward
with TBE's fused optimizer (EXACT_SGD or ADAM, learning rate 0.01). Two feeds: `device` (each
batch's indices and offsets already on the GPU) and `pinned` (copied from pinned host memory
every step, as a DataLoader with pin_memory hands them over).

    python benchmarks/gpu/tbe_torch.py IDS_DIR   (writes tbe.json to $OUT)

Needs PyTorch with CUDA and fbgemm-gpu on the path; run in its own process (not beside
TensorFlow).
"""
import json
import os
import sys
import time

import numpy as np
import torch
from fbgemm_gpu.split_embedding_configs import EmbOptimType, SparseType
from fbgemm_gpu.split_table_batched_embeddings_ops_common import (ComputeDevice,
                                                                  EmbeddingLocation, PoolingMode)
from fbgemm_gpu.split_table_batched_embeddings_ops_training import \
    SplitTableBatchedEmbeddingBagsCodegen

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import provenance  # noqa: E402
import tbe_workloads as workloads  # noqa: E402

POOLING = {"sum": PoolingMode.SUM, "mean": PoolingMode.MEAN, None: PoolingMode.NONE}


def log(*args):
    print(*args, flush=True)


def table_major(batch):
    """(indices, offsets) of one batch: table 0's bags, then table 1's, as TBE reads them."""
    indices = np.concatenate([ids for ids, _ in batch]).astype(np.int64)
    lengths = np.concatenate([lengths for _, lengths in batch])
    offsets = np.zeros(len(lengths) + 1, np.int64)
    np.cumsum(lengths, out=offsets[1:])
    return torch.from_numpy(indices), torch.from_numpy(offsets)


def make_tbe(spec, optimizer):
    extra = dict(eps=1e-7, beta1=0.9, beta2=0.999) if optimizer == "adam" else {}
    return SplitTableBatchedEmbeddingBagsCodegen(
        embedding_specs=[(rows, workloads.DIM, EmbeddingLocation.DEVICE, ComputeDevice.CUDA)
                         for rows in spec["vocabs"]],
        optimizer=EmbOptimType.ADAM if optimizer == "adam" else EmbOptimType.EXACT_SGD,
        learning_rate=0.01, pooling_mode=POOLING[spec["combiner"]],
        weights_precision=SparseType.FP32, output_dtype=SparseType.FP32,
        device=torch.device("cuda"), **extra)


def timed(step, iters, warmup=5, rounds=3):
    """Median over rounds of the wall time per step of `iters` steps, waiting for the last."""
    for i in range(warmup):
        step(i)
    torch.cuda.synchronize()
    samples = []
    for _ in range(rounds):
        start = time.perf_counter()
        for i in range(iters):
            step(i)
        torch.cuda.synchronize()
        samples.append((time.perf_counter() - start) / iters * 1e3)
    return float(np.median(samples))


def measure(name, optimizers, iters=20):
    spec = workloads.WORKLOADS[name]
    batches = workloads.load(IDS_DIR, name)
    host = [table_major(batch) for batch in batches]
    pinned = [(i.pin_memory(), o.pin_memory()) for i, o in host]
    on_device = [(i.cuda(), o.cuda()) for i, o in host]
    result = {}
    for optimizer in optimizers:
        emb = make_tbe(spec, optimizer)
        feeds = {"device": lambda k: on_device[k % len(on_device)],
                 "pinned": lambda k: tuple(t.cuda(non_blocking=True)
                                           for t in pinned[k % len(pinned)])}
        for feed, batch_of in feeds.items():
            if optimizer == optimizers[0]:
                def forward(k, batch_of=batch_of):
                    with torch.no_grad():
                        return emb(*batch_of(k)).sum()
                result[f"fwd_{feed}_ms"] = timed(forward, iters)

            def train(k, batch_of=batch_of):
                emb(*batch_of(k)).sum().backward()
            result[f"train_{optimizer}_{feed}_ms"] = timed(train, iters)
        del emb
        torch.cuda.empty_cache()
    log(name, json.dumps(result))
    return result


def main():
    global IDS_DIR
    IDS_DIR = sys.argv[1]
    names = sys.argv[2:] or list(workloads.WORKLOADS)
    payload = {"device": torch.cuda.get_device_name(0), "dim": workloads.DIM}
    for name in names:
        optimizers = ["sgd", "adam"] if name in ("T1", "T2", "G2", "G1b") else ["sgd"]
        payload[name] = measure(name, optimizers)
    with open(os.path.join(provenance.out_dir(), "tbe.json"), "w") as handle:
        json.dump(provenance.stamp(payload, payload["device"]), handle, indent=1)


if __name__ == "__main__":
    main()
