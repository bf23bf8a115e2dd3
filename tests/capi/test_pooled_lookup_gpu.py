"""The plugin's one-worker pooled lookup (Sok>PoolFromTables' kernel) and its SGD step
(Sok>PooledGradShares, then the sparse apply reading the bags' gradient in place) through the
C ABI, against a float64 PyTorch reference.

Skipped without PyTorch, a GPU or libsok_capi.so. Outputs are poisoned with NaN first."""
import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import capi  # noqa: E402

torch, LIB = capi.torch_and_library()
NO_ERROR = -1  # a clean LookupCheck's code (kit_src/core/embedding/lookup_check.h)


def reference(table64, ids, lengths, weights, mean):
    bags = len(lengths)
    owner = torch.repeat_interleave(torch.arange(bags, device="cuda"), lengths)
    w = torch.ones(len(ids), dtype=torch.float64, device="cuda") if weights is None \
        else weights.double()
    pooled = torch.zeros(bags, table64.shape[1], dtype=torch.float64, device="cuda")
    pooled.index_add_(0, owner, w[:, None] * table64[ids])
    denominator = torch.ones(bags, dtype=torch.float64, device="cuda")
    if mean:
        denominator = torch.zeros(bags, dtype=torch.float64, device="cuda").index_add_(0, owner, w)
    safe = torch.where(denominator == 0, torch.ones_like(denominator), denominator)
    pooled = torch.where(denominator[:, None] == 0, torch.zeros_like(pooled), pooled / safe[:, None])
    return pooled, owner, w, safe, denominator


@pytest.mark.parametrize("dim", [1, 16, 100, 128, 300])
@pytest.mark.parametrize("mean", [False, True])
@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("bags", [257, 3001])  # the backward sorts chunks of lookups
def test_forward_and_sgd_backward_match_float64(dim, mean, weighted, bags):
    g = torch.Generator(device="cuda").manual_seed(dim * 4 + mean * 2 + weighted + bags)
    rows = 1000
    lengths = torch.randint(0, 6, (bags,), device="cuda", generator=g)
    offsets = torch.zeros(bags + 1, dtype=torch.int64, device="cuda")
    offsets[1:] = torch.cumsum(lengths, 0)
    ids = torch.randint(0, rows, (int(offsets[-1]),), device="cuda", generator=g)
    weights = torch.rand(len(ids), device="cuda", generator=g) + 0.5 if weighted else None
    table = torch.randn(rows, dim, device="cuda", generator=g)
    out = torch.full((bags, dim), float("nan"), device="cuda")
    check = torch.full((3,), -7, dtype=torch.int64, device="cuda")
    stream = torch.cuda.current_stream().cuda_stream
    wptr = weights.data_ptr() if weighted else None
    capi.check(LIB.sok_pooled_lookup_forward(table.data_ptr(), rows, dim, ids.data_ptr(),
                                             offsets.data_ptr(), wptr, bags, len(ids), int(mean),
                                             out.data_ptr(), check.data_ptr(), stream))
    table64 = table.double()
    expected, owner, w, safe, denominator = reference(table64, ids, lengths, weights, mean)
    torch.cuda.synchronize()
    assert ((out.double() - expected).norm() / expected.norm()).item() < 1e-6
    assert check[0].item() == NO_ERROR

    grad = torch.randn(bags, dim, device="cuda", generator=g)
    lr = 0.3
    scale = torch.where(denominator[owner] == 0, torch.zeros_like(w), w / safe[owner])
    updated = table64.index_add(0, ids, -lr * scale[:, None] * grad.double()[owner])
    capi.check(LIB.sok_pooled_sgd_backward(table.data_ptr(), rows, dim, ids.data_ptr(),
                                           offsets.data_ptr(), wptr, bags, len(ids), int(mean),
                                           grad.data_ptr(), lr, stream))
    torch.cuda.synchronize()
    assert ((table.double() - updated).norm() / updated.norm()).item() < 1e-6


def test_an_id_outside_the_table_is_recorded_and_pools_as_zeros():
    rows, dim = 50, 8
    table = torch.randn(rows, dim, device="cuda")
    ids = torch.tensor([3, 4, rows + 5, 7], dtype=torch.int64, device="cuda")
    offsets = torch.tensor([0, 2, 4], dtype=torch.int64, device="cuda")
    out = torch.full((2, dim), float("nan"), device="cuda")
    check = torch.zeros(3, dtype=torch.int64, device="cuda")
    stream = torch.cuda.current_stream().cuda_stream
    capi.check(LIB.sok_pooled_lookup_forward(table.data_ptr(), rows, dim, ids.data_ptr(),
                                             offsets.data_ptr(), None, 2, 4, 0, out.data_ptr(),
                                             check.data_ptr(), stream))
    torch.cuda.synchronize()
    assert check[0].item() != NO_ERROR and check[1:].tolist() == [rows + 5, rows]
    assert torch.equal(out[0], table[3] + table[4]) and torch.equal(out[1], table[7])
