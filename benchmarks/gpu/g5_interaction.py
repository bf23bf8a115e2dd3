"""G5: CUDA dot interaction forward+backward (C ABI) vs PyTorch (bmm + tril gather, autograd),
batch 65,536, 27 x 128, CUDA events, same process. Writes JSON to $OUT (or benchmarks/out)."""
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__)))), "tests", "gpu"))
import capi  # noqa: E402
from gpu_timing import time_ms, write_result  # noqa: E402

B, F, D = 65536, 27, 128


def measure(x, grad, forward, backward):
    """(sok ms, torch ms) of forward + backward on features x and output gradient grad."""
    out = torch.empty(grad.shape, device="cuda", dtype=x.dtype)
    dx = torch.empty_like(x)
    stream = torch.cuda.current_stream().cuda_stream

    def sok_step():
        capi.check(forward(x.data_ptr(), out.data_ptr(), B, F, D, stream))
        capi.check(backward(x.data_ptr(), grad.data_ptr(), dx.data_ptr(), B, F, D, stream))

    rows, cols = torch.tril_indices(F, F, offset=-1, device="cuda")
    xt = x.clone().requires_grad_(True)

    def torch_step():
        products = torch.bmm(xt, xt.transpose(1, 2))
        y = torch.cat([xt[:, 0], products[:, rows, cols]], dim=1)
        (gx,) = torch.autograd.grad(y, xt, grad)
        return gx

    return time_ms(sok_step), time_ms(torch_step)


def main():
    lib = capi.load()
    x = torch.randn(B, F, D, device="cuda")
    width = D + F * (F - 1) // 2
    grad = torch.randn(B, width, device="cuda")
    sok_ms, torch_ms = measure(x, grad, lib.sok_dot_interaction_forward,
                               lib.sok_dot_interaction_backward)
    bytes_moved = 4 * (2 * B * F * D + 2 * B * width)  # read x twice, write out, read grad
    # float16 (mixed precision): sok sums in float32; torch runs bmm in float16 (tensor cores).
    sok16_ms, torch16_ms = measure(x.half(), grad.half(),
                                   lib.sok_dot_interaction_forward_f16,
                                   lib.sok_dot_interaction_backward_f16)
    result = {"benchmark": "G5 dot interaction fwd+bwd", "device": torch.cuda.get_device_name(),
              "torch": torch.__version__, "config": {"batch": B, "features": F, "dim": D},
              "sok_ms": round(sok_ms, 4), "torch_ms": round(torch_ms, 4),
              "speedup": round(torch_ms / sok_ms, 3), "target": ">= 2x torch",
              "sok_effective_GBps": round(bytes_moved / sok_ms / 1e6, 1),
              "float16": {"sok_ms": round(sok16_ms, 4), "torch_ms": round(torch16_ms, 4),
                          "speedup": round(torch16_ms / sok16_ms, 3)}}
    write_result("g5_interaction", result)
    print(f"| G5 | sok {sok_ms:.3f} ms | torch {torch_ms:.3f} ms | {torch_ms / sok_ms:.2f}x |")
    print(f"| G5 fp16 | sok {sok16_ms:.3f} ms | torch {torch16_ms:.3f} ms | "
          f"{torch16_ms / sok16_ms:.2f}x |")


if __name__ == "__main__":
    main()
