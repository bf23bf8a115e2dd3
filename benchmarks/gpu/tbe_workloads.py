"""The workloads measured against FBGEMM's table-batched embedding (TBE), shared by both sides.

Imports NumPy only: `tbe_torch.py` (PyTorch, FBGEMM) and `tf_vs_tbe.py` (TensorFlow, this
project) run in their own processes on the same GPU and read the same ids, written once by
`python benchmarks/gpu/tbe_workloads.py DIR`. A workload's file holds BATCHES batches; each
table's ids of batch k are `ids_<t>_<k>` with per-sample counts `lengths_<t>_<k>`.

T1  26 Criteo tables (vocabularies capped at 4M rows), dim 128, batch 65,536, one id a sample
    (Zipf(1.2) modulo the vocabulary), sum.
T2  T1 with 1..10 ids a sample, mean.
T3  one 8Mi x 128 table, batch 65,536, one uniform id a sample.
G1a one 8Mi x 128 table, 65,536 power-law (alpha 1.05) ids a batch, one a sample.
G1b the same, 1,048,576 ids a batch.
G2  10 tables x 1,677,721 rows, 104,857 power-law ids a table, no pooling (one vector an id).
"""
import os
import sys

import numpy as np

CRITEO_TB = [39884406, 39043, 17289, 7420, 20263, 3, 7120, 1543, 63, 38532951, 2953546, 403346,
             10, 2208, 11938, 155, 4, 976, 14, 39979771, 25641295, 39664984, 585935, 12972, 108,
             36]
DIM = 128
BATCHES = 4  # drawn once, cycled by both sides
COPY_GBPS = 3000.0  # H100 device-to-device copy bandwidth (docs/benchmarks.md)
# TBE_SCALE=n divides every vocabulary and batch by n: a quick run of the machinery on a CPU.
SCALE = int(os.environ.get("TBE_SCALE", "1"))

WORKLOADS = {
    "T1": dict(vocabs=[min(v, 4_000_000) for v in CRITEO_TB], batch=65536, hotness=1,
               combiner="sum", draw="zipf", pooled=True),
    "T2": dict(vocabs=[min(v, 4_000_000) for v in CRITEO_TB], batch=65536, hotness=10,
               combiner="mean", draw="zipf", pooled=True),
    "T3": dict(vocabs=[8 << 20], batch=65536, hotness=1, combiner="sum", draw="uniform",
               pooled=True),
    "G1a": dict(vocabs=[8 << 20], batch=65536, hotness=1, combiner="sum", draw="power",
                pooled=True),
    "G1b": dict(vocabs=[8 << 20], batch=1 << 20, hotness=1, combiner="sum", draw="power",
                pooled=True),
    "G2": dict(vocabs=[1677721] * 10, batch=104857, hotness=1, combiner=None, draw="power",
               pooled=False),
}


def _scaled(spec):
    return dict(spec, vocabs=[max(2, v // SCALE) for v in spec["vocabs"]],
                batch=max(1, spec["batch"] // SCALE))


WORKLOADS = {name: _scaled(spec) for name, spec in WORKLOADS.items()}


def power_law(rng, vocab, count, alpha=1.05):
    """dynamicemb's PowerLaw(1, N, alpha) sampler (docs/benchmarks.md): ids in [1, N - 1], the
    smallest hottest."""
    x = rng.random(count)
    y = (x * (vocab ** (1.0 - alpha) - 1.0) + 1.0) ** (1.0 / (1.0 - alpha))
    return np.minimum(y, vocab - 1).astype(np.int64)


def draw_ids(rng, kind, vocab, count):
    if kind == "zipf":
        return (rng.zipf(1.2, size=count) - 1) % vocab
    if kind == "uniform":
        return rng.integers(0, vocab, size=count)
    return power_law(rng, vocab, count)


def write(directory, name):
    spec = WORKLOADS[name]
    rng = np.random.default_rng(sum(map(ord, name)))
    arrays = {}
    for k in range(BATCHES):
        for t, vocab in enumerate(spec["vocabs"]):
            lengths = (np.ones(spec["batch"], np.int64) if spec["hotness"] == 1
                       else rng.integers(1, spec["hotness"] + 1, size=spec["batch"]))
            arrays[f"lengths_{t}_{k}"] = lengths
            arrays[f"ids_{t}_{k}"] = draw_ids(rng, spec["draw"], vocab, int(lengths.sum()))
    np.savez(os.path.join(directory, f"{name}.npz"), **arrays)


def load(directory, name):
    """[batch k][table t] -> (ids, lengths)."""
    spec = WORKLOADS[name]
    with np.load(os.path.join(directory, f"{name}.npz")) as data:
        return [[(data[f"ids_{t}_{k}"], data[f"lengths_{t}_{k}"])
                 for t in range(len(spec["vocabs"]))] for k in range(BATCHES)]


def floor_ms(name, batches, state_floats=0):
    """The bytes floor (docs/benchmarks.md's formulas, averaged over the batches): forward reads
    each id, each unique row once and writes each output row; train adds the update's reads
    and writes of each unique row and its optimizer state."""
    spec = WORKLOADS[name]
    fwd, train = [], []
    for batch in batches:
        ids = sum(len(i) for i, _ in batch)
        unique = sum(len(np.unique(i)) for i, _ in batch)
        outputs = ids if not spec["pooled"] else spec["batch"] * len(batch)
        fwd_bytes = 8 * ids + 4 * DIM * (unique + outputs)
        bwd_bytes = 8 * ids + 4 * DIM * outputs + 2 * 4 * unique * (DIM + state_floats)
        fwd.append(fwd_bytes)
        train.append(fwd_bytes + bwd_bytes)
    to_ms = 1.0 / COPY_GBPS / 1e6
    return float(np.mean(fwd)) * to_ms, float(np.mean(train)) * to_ms


def main():
    directory = sys.argv[1]
    os.makedirs(directory, exist_ok=True)
    for name in sys.argv[2:] or WORKLOADS:
        write(directory, name)
        print("wrote", name, flush=True)


if __name__ == "__main__":
    main()
