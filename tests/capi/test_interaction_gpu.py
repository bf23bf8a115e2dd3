"""CUDA dot interaction through the C ABI against a float64 PyTorch reference.

Skipped without PyTorch, a GPU or the built libsok_capi.so (benchmarks/gpu/run_on_device.sh
builds it). Outputs are poisoned with NaN first, inputs drawn fresh for every case.
"""
import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import capi  # noqa: E402

torch, LIB = capi.torch_and_library()


def reference(features):
    """float64: x[0] then x[i].x[j] for i > j, row-major lower triangle."""
    f = features.shape[1]
    products = torch.bmm(features, features.transpose(1, 2))
    rows, cols = torch.tril_indices(f, f, offset=-1, device=features.device)
    return torch.cat([features[:, 0], products[:, rows, cols]], dim=1)


def stream():
    return torch.cuda.current_stream().cuda_stream


@pytest.mark.parametrize("batch, num_features, dim", [(1, 2, 1), (3, 5, 7), (64, 27, 128),
                                                      (1000, 27, 16), (0, 4, 8), (5, 33, 64)])
def test_forward_and_backward_match_float64(batch, num_features, dim):
    generator = torch.Generator(device="cuda").manual_seed(batch * 31 + num_features)
    x = torch.randn(batch, num_features, dim, device="cuda", generator=generator)
    width = dim + num_features * (num_features - 1) // 2
    out = torch.full((batch, width), float("nan"), device="cuda")
    capi.check(LIB.sok_dot_interaction_forward(x.data_ptr(), out.data_ptr(), batch, num_features,
                                               dim, stream()))
    x64 = x.double().requires_grad_(True)
    ref = reference(x64)
    grad = torch.randn(batch, width, device="cuda", generator=generator)
    ref.backward(grad.double())
    dx = torch.full_like(x, float("nan"))
    capi.check(LIB.sok_dot_interaction_backward(x.data_ptr(), grad.data_ptr(), dx.data_ptr(),
                                                batch, num_features, dim, stream()))
    torch.cuda.synchronize()
    if batch == 0:
        return
    rel = lambda a, b: ((a.double() - b).norm() / b.norm().clamp_min(1e-30)).item()  # noqa: E731
    assert rel(out, ref.detach()) < 1e-5
    assert rel(dx, x64.grad) < 1e-5


@pytest.mark.parametrize("batch, num_features, dim", [(3, 5, 7), (64, 27, 128), (0, 4, 8)])
def test_float16_sums_in_float32_and_rounds_once(batch, num_features, dim):
    generator = torch.Generator(device="cuda").manual_seed(batch * 17 + dim)
    x = torch.randn(batch, num_features, dim, device="cuda", generator=generator).half()
    width = dim + num_features * (num_features - 1) // 2
    grad = torch.randn(batch, width, device="cuda", generator=generator).half()
    out = torch.full((batch, width), float("nan"), device="cuda", dtype=torch.float16)
    dx = torch.full_like(x, float("nan"))
    capi.check(LIB.sok_dot_interaction_forward_f16(x.data_ptr(), out.data_ptr(), batch,
                                                   num_features, dim, stream()))
    capi.check(LIB.sok_dot_interaction_backward_f16(x.data_ptr(), grad.data_ptr(), dx.data_ptr(),
                                                    batch, num_features, dim, stream()))
    x64 = x.double().requires_grad_(True)
    ref = reference(x64)
    ref.backward(grad.double())
    torch.cuda.synchronize()
    if batch == 0:
        return
    # One float16 rounding of an exact sum: elementwise relative error <= 2^-11 (+ tiny values).
    half_ulp = 2.0 ** -11
    assert torch.all((out.double() - ref.detach()).abs() <= 2 * half_ulp * ref.detach().abs() + 1e-3)
    assert torch.all((dx.double() - x64.grad).abs() <= 2 * half_ulp * x64.grad.abs() + 1e-3)
