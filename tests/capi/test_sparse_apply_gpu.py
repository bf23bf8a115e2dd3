"""CUDA lazy optimizer updates (C ABI sok_sparse_apply) against float64 PyTorch references
of the Keras formulas: duplicate ids summed, touched rows and their state stepped once,
untouched rows unchanged, bad input refused before any write.

Skipped without PyTorch, a GPU or libsok_capi.so."""
import ctypes
import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import capi  # noqa: E402

torch, LIB = capi.torch_and_library()
CUDA_ERROR_INVALID_VALUE = 1


def sgd(w, s, g, h, nesterov):
    lr, momentum = h
    if momentum == 0:
        return w - lr * g, s
    v = momentum * s[0] - lr * g
    return w + (momentum * v - lr * g if nesterov else v), [v]


def adagrad(w, s, g, h, _):
    lr, eps, inside = h
    acc = s[0] + g * g
    return w - lr * g / (torch.sqrt(acc + eps) if inside else torch.sqrt(acc) + eps), [acc]


def adam(w, s, g, h, _):
    lr, b1, b2, eps = h
    m, v = b1 * s[0] + (1 - b1) * g, b2 * s[1] + (1 - b2) * g * g
    return w - lr * m / (torch.sqrt(v) + eps), [m, v]


def adamax(w, s, g, h, _):
    lr, b1, b2, eps = h
    m, u = b1 * s[0] + (1 - b1) * g, torch.maximum(b2 * s[1], g.abs())
    return w - lr * m / (u + eps), [m, u]


def adadelta(w, s, g, h, _):
    lr, rho, eps = h
    accum = rho * s[0] + (1 - rho) * g * g
    update = torch.sqrt(s[1] + eps) / torch.sqrt(accum + eps) * g
    return w - lr * update, [accum, rho * s[1] + (1 - rho) * update * update]


def rmsprop(w, s, g, h, _):
    lr, rho, momentum, eps, centered, inside = h
    ms = rho * s[0] + (1 - rho) * g * g
    mom, mg = s[1], s[2] if centered else None
    square = ms
    if centered:
        mg = rho * mg + (1 - rho) * g
        square = ms - mg * mg
    if momentum == 0:
        w = w - lr * g / (torch.sqrt(square + eps) if inside else torch.sqrt(square) + eps)
    else:
        mom = momentum * mom + lr * g / torch.sqrt(square + eps)
        w = w - mom
    return w, [ms, mom] + ([mg] if centered else [])


def nadam(w, s, g, h, _):
    lr, b1, b2, eps, m_now, m_next, one_minus_sched, one_minus_next, one_minus_b2t = h
    m, v = b1 * s[0] + (1 - b1) * g, b2 * s[1] + (1 - b2) * g * g
    m_bar = (1 - m_now) * g / one_minus_sched + m_next * m / one_minus_next
    return w - lr * m_bar / (torch.sqrt(v / one_minus_b2t) + eps), [m, v]


def ftrl(w, s, g, h, _):
    lr, power, l1, l2, shrinkage = h
    shrunk = g + 2 * shrinkage * w
    accum = s[0] + g * g
    linear = s[1] + shrunk - (accum ** -power - s[0] ** -power) / lr * w
    quadratic = accum ** -power / lr + 2 * l2
    w = torch.where(linear.abs() > l1, (torch.sign(linear) * l1 - linear) / quadratic,
                    torch.zeros_like(linear))
    return w, [accum, linear]


# (rule, hyper, nesterov, state sections, reference)
CASES = {
    "sgd": ("sgd", [0.1, 0.0], False, 0, sgd),
    "momentum": ("sgd", [0.05, 0.9], False, 1, sgd),
    "nesterov": ("sgd", [0.05, 0.8], True, 1, sgd),
    "adagrad": ("adagrad", [0.1, 1e-7, 0.0], False, 1, adagrad),
    "adagrad_inside": ("adagrad", [0.1, 1e-7, 1.0], False, 1, adagrad),
    "adam": ("adam", [0.01, 0.9, 0.999, 1e-7], False, 2, adam),
    "adamax": ("adamax", [0.02, 0.9, 0.999, 1e-7], False, 2, adamax),
    "adadelta": ("adadelta", [1.0, 0.95, 1e-7], False, 2, adadelta),
    "rmsprop": ("rmsprop", [0.01, 0.9, 0.0, 1e-7, 0.0, 0.0], False, 2, rmsprop),
    "rmsprop_momentum_centered": ("rmsprop", [0.01, 0.9, 0.5, 1e-7, 1.0, 0.0], False, 3, rmsprop),
    "nadam": ("nadam", [0.01, 0.9, 0.999, 1e-7, 0.85, 0.86, 0.2, 0.3, 0.01], False, 2, nadam),
    "ftrl": ("ftrl", [0.1, -0.5, 0.01, 0.02, 0.0], False, 2, ftrl),
    "ftrl_power_shrinkage": ("ftrl", [0.1, -0.6, 0.01, 0.02, 0.05], False, 2, ftrl),
}


def apply(rule, hyper, nesterov, table, state, ids, grads):
    h = (ctypes.c_float * len(hyper))(*hyper)
    sections = 0 if state is None else state.shape[1] // table.shape[1]
    return LIB.sok_sparse_apply(rule.encode(), h, len(hyper), int(nesterov), table.data_ptr(),
                                None if state is None else state.data_ptr(), table.shape[0],
                                table.shape[1], sections * table.shape[1], ids.data_ptr(),
                                grads.data_ptr(), len(ids),
                                torch.cuda.current_stream().cuda_stream)


@pytest.mark.parametrize("dim", [1, 16, 100, 128, 300, 600])
@pytest.mark.parametrize("case", sorted(CASES))
def test_touched_rows_take_one_step_of_the_rule(case, dim):
    rule, hyper, nesterov, sections, reference = CASES[case]
    g = torch.Generator(device="cuda").manual_seed(dim * 100 + sorted(CASES).index(case))
    rows, touched_range, n = 500, 300, 2000
    table = torch.randn(rows, dim, device="cuda", generator=g)
    # Accumulators stay positive (square roots, powers), other state any sign.
    state = torch.rand(rows, sections * dim, device="cuda", generator=g) + 0.1 if sections else None
    if sections == 3:  # centered RMSprop: a mean gradient below the root mean square
        state[:, 2 * dim:] = 0.0
    # Duplicates: most rows a few uses, three hot rows hundreds (summed across blocks).
    ids = torch.cat([torch.randint(0, touched_range, (n,), device="cuda", generator=g),
                     torch.randint(0, 3, (n // 2,), device="cuda", generator=g)])
    ids = ids[torch.randperm(len(ids), device="cuda", generator=g)]
    n = len(ids)
    # The hot rows' gradients scaled so that their sums are of the size of one use's (float32
    # sums of hundreds of unit gradients round apart from float64 beyond the tolerance).
    grads = torch.randn(n, dim, device="cuda", generator=g) * torch.where(ids < 3, 0.05, 1.0)[:, None]
    before, state_before = table.clone(), None if state is None else state.clone()
    capi.check(apply(rule, hyper, nesterov, table, state, ids, grads))
    torch.cuda.synchronize()

    unique = torch.unique(ids)
    summed = torch.zeros(rows, dim, dtype=torch.float64, device="cuda").index_add_(
        0, ids, grads.double())[unique]
    sections_before = [] if state is None else \
        [state_before[unique, k * dim:(k + 1) * dim].double() for k in range(sections)]
    expected_w, expected_s = reference(before[unique].double(), sections_before, summed, hyper,
                                       nesterov)
    assert torch.allclose(table[unique].double(), expected_w, rtol=1e-5, atol=1e-5)
    for k, expected in enumerate(expected_s):
        assert torch.allclose(state[unique, k * dim:(k + 1) * dim].double(), expected,
                              rtol=1e-5, atol=1e-5), f"state section {k}"
    untouched = torch.ones(rows, dtype=torch.bool, device="cuda")
    untouched[unique] = False
    assert torch.equal(table[untouched], before[untouched])
    if state is not None:
        assert torch.equal(state[untouched], state_before[untouched])


def test_out_of_range_id_unknown_rule_and_wrong_hyper_count_are_refused_before_writing():
    table = torch.randn(10, 4, device="cuda")
    state = torch.zeros(10, 8, device="cuda")
    grads = torch.ones(3, 4, device="cuda")
    before = table.clone()
    hyper = [0.01, 0.9, 0.999, 1e-7]
    assert apply("adam", hyper, False, table, state,
                 torch.tensor([1, 10, 2], device="cuda"), grads) == CUDA_ERROR_INVALID_VALUE
    assert apply("adam", hyper, False, table, state,
                 torch.tensor([1, -1, 2], device="cuda"), grads) == CUDA_ERROR_INVALID_VALUE
    ok_ids = torch.tensor([1, 2, 3], device="cuda")
    assert apply("lion", hyper, False, table, state, ok_ids, grads) == CUDA_ERROR_INVALID_VALUE
    assert apply("adam", hyper[:3], False, table, state, ok_ids, grads) == CUDA_ERROR_INVALID_VALUE
    torch.cuda.synchronize()
    assert torch.equal(table, before) and torch.count_nonzero(state) == 0


def test_no_ids_changes_nothing():
    table = torch.randn(10, 4, device="cuda")
    before = table.clone()
    empty = torch.zeros(0, dtype=torch.int64, device="cuda")
    capi.check(apply("sgd", [0.1, 0.0], False, table, None, empty,
                     torch.zeros(0, 4, device="cuda")))
    torch.cuda.synchronize()
    assert torch.equal(table, before)
