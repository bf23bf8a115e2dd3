"""Sparse (lazy) Adam step on the GPU: a table of 8Mi rows x 128 with its Adam state, batches
of 1Mi power-law ids (duplicates summed) with [1Mi, 128] gradients, through the C ABI
(sok_sparse_apply) vs PyTorch doing the same in the same process: torch.unique, index_add_
of the gradients, Adam on the unique rows, written back (docs/benchmarks.md's "dedup Adam
update", the optimizer half of G1c). CUDA events, same batches."""
import ctypes
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__)))), "tests", "gpu"))
import capi  # noqa: E402
from gpu_timing import cycler, time_ms, write_result  # noqa: E402
from g3_pooled import COPY_GBPS, power_law  # noqa: E402

ROWS, DIM, BATCH, BATCHES = 8 * 1024 * 1024, 128, 1024 * 1024, 10
LR, BETA1, BETA2, EPSILON = 1e-3, 0.9, 0.999, 1e-7


def main():
    lib = capi.load()
    g = torch.Generator(device="cuda").manual_seed(0)
    batches = [(power_law(BATCH, g), torch.randn(BATCH, DIM, device="cuda", generator=g) * 1e-3)
               for _ in range(BATCHES)]
    table = torch.randn(ROWS, DIM, device="cuda") * 0.01
    state = torch.zeros(ROWS, 2 * DIM, device="cuda")  # m then v, per row
    weights, m, v = table.clone(), torch.zeros(ROWS, DIM, device="cuda"), \
        torch.zeros(ROWS, DIM, device="cuda")
    hyper = (ctypes.c_float * 4)(LR, BETA1, BETA2, EPSILON)  # bias correction left out: same work
    stream = torch.cuda.current_stream().cuda_stream
    next_batch = cycler(batches)

    def sok_step():
        ids, grads = next_batch()
        capi.check(lib.sok_sparse_apply(b"adam", hyper, 4, 0, table.data_ptr(), state.data_ptr(),
                                        ROWS, DIM, 2 * DIM, ids.data_ptr(), grads.data_ptr(),
                                        BATCH, stream))

    def torch_step():
        ids, grads = next_batch()
        unique, inverse = torch.unique(ids, return_inverse=True)
        summed = torch.zeros(len(unique), DIM, device="cuda").index_add_(0, inverse, grads)
        m_rows = m[unique].mul_(BETA1).add_(summed, alpha=1 - BETA1)
        v_rows = v[unique].mul_(BETA2).addcmul_(summed, summed, value=1 - BETA2)
        w_rows = weights[unique].addcdiv_(m_rows, v_rows.sqrt().add_(EPSILON), value=-LR)
        m[unique], v[unique], weights[unique] = m_rows, v_rows, w_rows

    results = {"sok_ms": time_ms(sok_step), "torch_ms": time_ms(torch_step)}
    unique = sum(len(torch.unique(ids)) for ids, _ in batches) / BATCHES
    # ids and gradients read once; each unique row's weights, m and v read and written
    floor = (8 * BATCH + BATCH * DIM * 4 + 2 * unique * 3 * DIM * 4) / (COPY_GBPS * 1e6)
    results = {k: round(t, 4) for k, t in results.items()}
    results.update({"speedup_vs_torch": round(results["torch_ms"] / results["sok_ms"], 3),
                    "ids_per_batch": BATCH, "unique_rows_per_batch": unique,
                    "floor_ms": round(floor, 4),
                    "floor_fraction": round(floor / results["sok_ms"], 3)})
    payload = {"benchmark": "sparse Adam step, 8Mi x 128 table, 1Mi power-law ids a batch",
               "device": torch.cuda.get_device_name(), "torch": torch.__version__,
               "results": results}
    write_result("gpu_sparse_adam", payload)
    print(f"| sparse Adam | sok {results['sok_ms']} ms | torch {results['torch_ms']} ms | "
          f"{results['speedup_vs_torch']}x | floor fraction {results['floor_fraction']} |")


if __name__ == "__main__":
    main()
