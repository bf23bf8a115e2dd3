"""The CUDA hash table (C ABI sok_gpu_table_*) against a Python dict: find, find-or-insert,
insert-or-assign, erase; duplicate keys in one call, extreme keys, refusals before writes.

Skipped without PyTorch, a GPU or libsok_capi.so."""
import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import capi  # noqa: E402

torch, LIB = capi.torch_and_library()
EMPTY, ERASED = -(1 << 63), -(1 << 63) + 1
CUDA_ERROR_INVALID_VALUE = 1


class Table:
    def __init__(self, capacity, dim, max_load=0.75):
        self.slots = torch.full((capacity,), EMPTY, dtype=torch.int64, device="cuda")
        self.values = torch.full((capacity, dim), float("nan"), device="cuda")
        self.counters = torch.zeros(2, dtype=torch.int64, device="cuda")
        self.args = (self.slots.data_ptr(), self.values.data_ptr(), self.counters.data_ptr(),
                     capacity, dim, max_load)
        self.dim = dim

    @staticmethod
    def stream():
        return torch.cuda.current_stream().cuda_stream

    def find(self, keys):
        keys = keys.contiguous()  # the C ABI reads raw memory
        out = torch.full((len(keys), self.dim), float("nan"), device="cuda")
        found = torch.full((len(keys),), 7, dtype=torch.uint8, device="cuda")
        capi.check(LIB.sok_gpu_table_find(*self.args, keys.data_ptr(), len(keys), out.data_ptr(),
                                          found.data_ptr(), self.stream()))
        return out, found.bool()

    def upsert(self, keys, values=None):
        keys = keys.contiguous()
        values = None if values is None else values.contiguous()
        out = torch.full((len(keys), self.dim), float("nan"), device="cuda")
        code = LIB.sok_gpu_table_upsert(*self.args, keys.data_ptr(), len(keys),
                                        None if values is None else values.data_ptr(),
                                        out.data_ptr(), self.stream())
        return code, out

    def erase(self, keys):
        keys = keys.contiguous()
        capi.check(LIB.sok_gpu_table_erase(*self.args, keys.data_ptr(), len(keys), self.stream()))


def random_keys(g, n):
    """Distinct keys over the whole int64 range (the two reserved values excluded)."""
    keys = torch.randint(-(1 << 63) + 2, (1 << 63) - 1, (n,), device="cuda", generator=g)
    keys[:4] = torch.tensor([0, -1, (1 << 63) - 1, -(1 << 63) + 2], device="cuda")
    return torch.unique(keys)


@pytest.mark.parametrize("dim", [1, 8, 64])
def test_insert_or_assign_then_find_matches_a_dict(dim):
    g = torch.Generator(device="cuda").manual_seed(dim)
    table = Table(1 << 14, dim)
    keys = random_keys(g, 6000)
    present, absent = keys[:5000], keys[5000:]
    values = torch.randn(len(present), dim, device="cuda", generator=g)
    code, out = table.upsert(present, values)
    assert code == 0
    assert torch.equal(out, values)
    query = torch.cat([present, absent])[torch.randperm(len(keys), device="cuda", generator=g)]
    rows, found = table.find(query)
    reference = dict(zip(present.tolist(), values.cpu()))
    for key, row, hit in zip(query.tolist(), rows.cpu(), found.tolist()):
        assert hit == (key in reference)
        assert torch.equal(row, reference[key] if hit else torch.zeros(dim))
    assert table.counters.tolist() == [len(present), len(present)]


def test_find_or_insert_with_duplicates_inserts_each_new_key_once():
    g = torch.Generator(device="cuda").manual_seed(1)
    dim = 8
    table = Table(1 << 18, dim)
    old = random_keys(g, 1000)
    old_values = torch.randn(len(old), dim, device="cuda", generator=g)
    assert table.upsert(old, old_values)[0] == 0
    new = random_keys(g, 20000)
    new = new[~torch.isin(new, old)]
    # 100,000 lookups of a mix of old and new keys, each repeated many times, in one call.
    pool = torch.cat([old, new])
    query = pool[torch.randint(0, len(pool), (100000,), device="cuda", generator=g)]
    code, out = table.upsert(query)
    assert code == 0
    is_old = torch.isin(query, old)
    index = torch.searchsorted(torch.sort(old).values, query[is_old])
    expected_old = old_values[torch.sort(old).indices[index]]
    assert torch.equal(out[is_old], expected_old)
    assert torch.count_nonzero(out[~is_old]) == 0
    distinct = len(torch.unique(query[~is_old])) + len(old)
    assert table.counters.tolist() == [distinct, distinct]
    live = table.slots[(table.slots != EMPTY) & (table.slots != ERASED)]
    assert len(live) == len(torch.unique(live)) == distinct  # no key claimed two slots


def test_erase_leaves_tombstones_that_probing_passes():
    g = torch.Generator(device="cuda").manual_seed(2)
    dim = 4
    table = Table(1 << 12, dim, max_load=0.9)  # a small table: long probe sequences
    keys = random_keys(g, 3000)
    values = torch.randn(len(keys), dim, device="cuda", generator=g)
    assert table.upsert(keys, values)[0] == 0
    gone, kept = keys[::2], keys[1::2]
    table.erase(torch.cat([gone, gone[:10]]))  # erasing twice counts once
    rows, found = table.find(keys)
    assert not found[::2].any() and found[1::2].all()
    assert torch.equal(rows[1::2], values[1::2]) and torch.count_nonzero(rows[::2]) == 0
    assert table.counters.tolist() == [len(kept), len(keys)]
    code, out = table.upsert(gone[:100])  # back, as new zero rows
    assert code == 0 and torch.count_nonzero(out) == 0
    assert table.find(gone[:100])[1].all()


def test_reserved_keys_and_overload_are_refused_before_any_write():
    table = Table(1 << 10, 2, max_load=0.5)
    before = table.slots.clone()
    for reserved in (EMPTY, ERASED):
        keys = torch.tensor([5, reserved, 6], device="cuda")
        assert table.upsert(keys)[0] == CUDA_ERROR_INVALID_VALUE
    too_many = torch.arange(1, 600, device="cuda")  # 599 > 0.5 * 1024
    assert table.upsert(too_many)[0] == CUDA_ERROR_INVALID_VALUE
    torch.cuda.synchronize()
    assert torch.equal(table.slots, before) and table.counters.tolist() == [0, 0]
    assert not table.find(torch.tensor([5, 6, EMPTY], device="cuda"))[1].any()
