"""The GPU input distribution of static tables (the core's SortPartitionKeys and
ScatterPartition, which Sok>PartitionKeys runs on a GPU) against a NumPy model of the
placement rule: each id's key (owner worker, table, local row), the unique keys grouped by
worker, then table, then row, each worker's count and each id's position; out-of-range ids
reported with their lookup.

Skipped without PyTorch, a GPU or libsok_capi.so. Outputs are poisoned first."""
import ctypes
import os
import sys

import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import capi  # noqa: E402

torch, LIB = capi.torch_and_library()


def partition(ids_per_lookup, tables, rows, owners, num_workers, dedup):
    """(send_keys, position, splits, unique, bad_lookup, bad_id) from the library."""
    ids = torch.tensor(np.concatenate(ids_per_lookup).astype(np.int64), device="cuda")
    total = len(ids)
    counts = np.array([len(i) for i in ids_per_lookup], np.int64)
    send_keys = torch.full((max(total, 1),), -7, dtype=torch.int64, device="cuda")
    position = torch.full((max(total, 1),), -7, dtype=torch.int32, device="cuda")
    splits = np.full(num_workers, -7, np.int64)
    out = [ctypes.c_int64(-7) for _ in range(3)]
    tables = np.asarray(tables, np.int32)
    rows = np.asarray(rows, np.int64)
    owners = np.asarray(owners, np.int32)
    capi.check(LIB.sok_partition_keys(
        ids.data_ptr(), counts.ctypes.data, tables.ctypes.data, len(counts), rows.ctypes.data,
        owners.ctypes.data, len(rows), num_workers, int(dedup), send_keys.data_ptr(),
        position.data_ptr(), splits.ctypes.data, *(ctypes.byref(o) for o in out),
        torch.cuda.current_stream().cuda_stream))
    unique, bad_lookup, bad_id = (o.value for o in out)
    return (send_keys[:unique].cpu().numpy(), position[:total].cpu().numpy(), splits, unique,
            bad_lookup, bad_id)


def reference(ids_per_lookup, tables, owners, num_workers, dedup):
    keys = []
    for ids, table in zip(ids_per_lookup, tables):
        owner = owners[table]
        for i in ids:
            worker, row = (owner, i) if owner >= 0 else (i % num_workers, i // num_workers)
            keys.append((worker, table, row))
    order = sorted(range(len(keys)), key=lambda k: keys[k])
    unique = sorted(set(keys)) if dedup else [keys[k] for k in order]
    index = {key: n for n, key in enumerate(unique)} if dedup else None
    position = np.empty(len(keys), np.int64)
    for n, k in enumerate(order):
        position[k] = index[keys[k]] if dedup else n
    send = np.array([(t << 48) | r for _, t, r in unique], np.int64)
    splits = np.bincount([w for w, _, _ in unique], minlength=num_workers)
    return send, position, splits


@pytest.mark.parametrize("num_workers", [1, 2, 3])
@pytest.mark.parametrize("dedup", [True, False])
def test_partition_matches_the_placement_rule(num_workers, dedup):
    rng = np.random.default_rng(num_workers * 2 + dedup)
    rows = [1000, 7, 50000]
    owners = [-1, num_workers - 1, -1]  # table 1 localized on the last worker
    tables = [0, 2, 1, 0]               # table 0 looked up twice
    ids = [rng.integers(0, rows[t], size) for t, size in zip(tables, [3000, 2000, 40, 0])]
    send, position, splits, unique, bad_lookup, _ = partition(ids, tables, rows, owners,
                                                              num_workers, dedup)
    expected_send, expected_position, expected_splits = reference(ids, tables, owners,
                                                                  num_workers, dedup)
    assert bad_lookup == -1
    assert unique == len(expected_send)
    np.testing.assert_array_equal(send, expected_send)
    np.testing.assert_array_equal(position, expected_position)
    np.testing.assert_array_equal(splits, expected_splits)


def test_an_id_out_of_range_names_its_lookup():
    ids = [np.array([1, 2, 3]), np.array([4, 10, -1])]
    *_, bad_lookup, bad_id = partition(ids, [0, 1], [100, 10], [-1, -1], 2, True)
    assert (bad_lookup, bad_id) == (1, 10)  # the first bad id of the first bad lookup
