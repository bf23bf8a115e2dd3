"""Splits a raw Criteo-format file into label.bin, dense.bin, category.bin and metadata.json.

Usage: python split_bin.py INPUT OUTPUT --slot_size_array="[...]" [--dense_type int32
       --label_type int32 --category_type int32 --dense_log True]

The values are written unchanged in the requested types; `dense_log` is recorded in
metadata.json and the reader applies log(x + 3) to the dense features.
"""
import argparse
import json
import os

import numpy as np
from tqdm import tqdm

from criteo_format import (NUM_CATEGORICAL, NUM_DENSE, RECORD_BYTES, RECORD_INTS, TYPES,
                           parse_slot_sizes)

CHUNK_RECORDS = 1 << 18


def str2bool(text):
    if str(text).lower() in ("true", "1", "yes"):
        return True
    if str(text).lower() in ("false", "0", "no"):
        return False
    raise argparse.ArgumentTypeError(f"expected True or False, got {text!r}")


def split(input_path, output_dir, slot_sizes, dense_type="int32", label_type="int32",
          category_type="int32", dense_log=True):
    """Writes the split files (to temporary names, renamed once all is valid)."""
    size = os.path.getsize(input_path)
    if size % RECORD_BYTES:
        raise ValueError(f"{input_path} has {size} bytes, not a multiple of the {RECORD_BYTES}-"
                         "byte record: truncated or not a Criteo-format file")
    for name, value in [("dense_type", dense_type), ("label_type", label_type),
                        ("category_type", category_type)]:
        if value not in TYPES:
            raise ValueError(f"--{name} {value!r} is not one of {sorted(TYPES)}")
    records = size // RECORD_BYTES
    limits = np.asarray(slot_sizes, np.int64)
    os.makedirs(output_dir, exist_ok=True)
    names = ["label.bin", "dense.bin", "category.bin"]
    temporary = [os.path.join(output_dir, f".{n}.partial") for n in names]
    raw = np.memmap(input_path, dtype="<i4", mode="r", shape=(records, RECORD_INTS))
    try:
        with open(temporary[0], "wb") as labels, open(temporary[1], "wb") as dense, \
                open(temporary[2], "wb") as category:
            for start in tqdm(range(0, records, CHUNK_RECORDS), desc="split", unit="chunk"):
                chunk = np.asarray(raw[start:start + CHUNK_RECORDS])
                ids = chunk[:, 1 + NUM_DENSE:]
                bad = (ids < 0) | (ids >= limits)
                if bad.any():
                    row, slot = np.argwhere(bad)[0]
                    raise ValueError(f"record {start + row}: id {ids[row, slot]} of slot {slot} "
                                     f"is outside its vocabulary [0, {limits[slot]})")
                chunk[:, 0].astype(TYPES[label_type]).tofile(labels)
                chunk[:, 1:1 + NUM_DENSE].astype(TYPES[dense_type]).tofile(dense)
                ids.astype(TYPES[category_type]).tofile(category)
    except BaseException:
        for path in temporary:
            if os.path.exists(path):
                os.remove(path)
        raise
    for path, name in zip(temporary, names):
        os.replace(path, os.path.join(output_dir, name))
    # SOK's keys (vocab_sizes, *_raw_type, dense_log), so SOK's scripts read these files,
    # and this project's (*_type, samples, ...), which dataset.py reads as well.
    metadata = {"samples": int(records), "vocab_sizes": list(map(int, slot_sizes)),
                "label_raw_type": label_type, "dense_raw_type": dense_type,
                "category_raw_type": category_type,
                "label_type": label_type, "dense_type": dense_type,
                "category_type": category_type, "dense_log": bool(dense_log),
                "num_dense": NUM_DENSE, "num_categorical": NUM_CATEGORICAL}
    with open(os.path.join(output_dir, "metadata.json"), "w") as handle:
        json.dump(metadata, handle, indent=2)
    return metadata


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("input")
    parser.add_argument("output")
    parser.add_argument("--slot_size_array", required=True, type=parse_slot_sizes)
    parser.add_argument("--dense_type", default="int32")
    parser.add_argument("--label_type", default="int32")
    parser.add_argument("--category_type", default="int32")
    parser.add_argument("--dense_log", type=str2bool, default=True)
    args = parser.parse_args()
    metadata = split(args.input, args.output, args.slot_size_array, args.dense_type,
                     args.label_type, args.category_type, args.dense_log)
    print(f"wrote {metadata['samples']} samples to {args.output}")


if __name__ == "__main__":
    main()
