"""Reads split Criteo-format files: each Horovod worker gets its slice of every global batch.

Training drops the last partial global batch; evaluation keeps it and spreads it over the
workers (some may get no samples). Batches are prepared on a background thread.
"""
import json
import os
import queue
import threading

import numpy as np

from criteo_format import NUM_CATEGORICAL, NUM_DENSE, TYPES


def local_slice(global_size, rank, num_workers):
    """[begin, end) of worker `rank` within a batch of `global_size` samples."""
    base, extra = divmod(global_size, num_workers)
    begin = rank * base + min(rank, extra)
    return begin, begin + base + (1 if rank < extra else 0)


_FILES = {"label": ("label.bin", 1), "dense": ("dense.bin", NUM_DENSE),
          "category": ("category.bin", NUM_CATEGORICAL)}


def read_metadata(data_dir):
    """metadata.json in either spelling: this project's (label_type, ..., samples) or SOK's
    (label_raw_type, ...; no sample count: it follows from the files' sizes, which must
    agree). Returns this project's keys."""
    path = os.path.join(data_dir, "metadata.json")
    with open(path) as handle:
        metadata = json.load(handle)
    for kind in _FILES:
        key = f"{kind}_type"
        value = metadata.get(key, metadata.get(f"{kind}_raw_type", "int32"))
        if value not in TYPES:
            raise ValueError(f"{path}: {key} {value!r} is not one of {sorted(TYPES)}")
        metadata[key] = value
    metadata["dense_log"] = str(metadata.get("dense_log", True)).lower() in ("true", "1")
    counts = {}
    for kind, (name, width) in _FILES.items():
        row_bytes = np.dtype(TYPES[metadata[f"{kind}_type"]]).itemsize * width
        size = os.path.getsize(os.path.join(data_dir, name))
        if size % row_bytes:
            raise ValueError(f"{name} has {size} bytes, not a multiple of its {row_bytes}-byte "
                             "sample: truncated, or metadata.json names the wrong type")
        counts[name] = size // row_bytes
    if len(set(counts.values())) != 1:
        raise ValueError(f"the files in {data_dir} hold different sample counts: {counts}")
    samples = next(iter(counts.values()))
    if metadata.setdefault("samples", samples) != samples:
        raise ValueError(f"{path} says {metadata['samples']} samples but the files hold "
                         f"{samples}")
    return metadata


class BinaryDataset:
    """Iterates (dense [b, 13] float32, categorical [b, 26] int64, labels [b, 1] float32)."""

    def __init__(self, data_dir, global_batch_size, rank=0, num_workers=1, training=True,
                 prefetch=4):
        self.metadata = read_metadata(data_dir)
        samples = self.metadata["samples"]
        read = lambda name, kind, width: np.memmap(  # noqa: E731
            os.path.join(data_dir, name), dtype=TYPES[self.metadata[kind]], mode="r",
            shape=(samples, width) if width else (samples,))
        self.labels = read("label.bin", "label_type", 0)
        self.dense = read("dense.bin", "dense_type", NUM_DENSE)
        self.categorical = read("category.bin", "category_type", NUM_CATEGORICAL)
        self.global_batch_size = global_batch_size
        self.rank, self.num_workers, self.training = rank, num_workers, training
        self.prefetch = prefetch
        full, partial = divmod(samples, global_batch_size)
        self.num_batches = full if training or partial == 0 else full + 1
        self.samples = samples

    def __len__(self):
        return self.num_batches

    def batch(self, index):
        start = index * self.global_batch_size
        size = min(self.global_batch_size, self.samples - start)
        begin, end = local_slice(size, self.rank, self.num_workers)
        dense = np.asarray(self.dense[start + begin:start + end], np.float32)
        if self.metadata["dense_log"]:
            dense = np.log(dense + 3.0, dtype=np.float32)
        categorical = np.asarray(self.categorical[start + begin:start + end], np.int64)
        labels = np.asarray(self.labels[start + begin:start + end], np.float32)[:, None]
        return dense, categorical, labels

    def __iter__(self):
        """Batches in order, prepared `prefetch` ahead on a background thread."""
        ready = queue.Queue(maxsize=self.prefetch)
        done = object()

        def produce():
            for index in range(self.num_batches):
                ready.put(self.batch(index))
            ready.put(done)

        threading.Thread(target=produce, daemon=True).start()
        while True:
            item = ready.get()
            if item is done:
                return
            yield item


class SyntheticDataset:
    """Random batches of the same shapes, for --use_synthetic_dataset (no files). Up to
    CACHED distinct batches are drawn once, as tensors on the default device (the GPU where
    there is one), and repeated: drawing them each step would cost more than a GPU step."""

    CACHED = 8

    def __init__(self, vocab_sizes, global_batch_size, rank, num_workers, num_batches, seed=0):
        self.vocab_sizes = np.asarray(vocab_sizes)
        begin, end = local_slice(global_batch_size, rank, num_workers)
        self.local = end - begin
        self.num_batches = num_batches
        self.rng = np.random.default_rng(seed + rank)
        self.batches = []

    def __len__(self):
        return self.num_batches

    def _draw(self):
        import tensorflow as tf  # noqa: PLC0415

        dense = np.log(self.rng.poisson(5, size=(self.local, NUM_DENSE)) + 3.0).astype(np.float32)
        categorical = (self.rng.random((self.local, NUM_CATEGORICAL)) * self.vocab_sizes).astype(np.int64)
        labels = (self.rng.random((self.local, 1)) < 0.25).astype(np.float32)
        return tuple(tf.constant(array) for array in (dense, categorical, labels))

    def __iter__(self):
        for step in range(self.num_batches):
            if len(self.batches) < min(self.CACHED, self.num_batches):
                self.batches.append(self._draw())
            yield self.batches[step % len(self.batches)]
