"""G3: pooled lookup from 8Mi rows (dim 128), 65,536 bags of U{1..10} power-law ids, sum:
forward and train (forward, then the backward and SGD step) of the plugin's one-worker pooled
lookup kernels (Sok>PoolFromTables, Sok>PooledGradShares and the sparse apply) through the C
ABI vs torch EmbeddingBag (sparse gradients + torch.optim.SGD), CUDA events, same process and
batches."""
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__)))), "tests", "gpu"))
import capi  # noqa: E402
from gpu_timing import cycler, time_ms, write_result  # noqa: E402

ROWS, DIM, BAGS, BATCHES, ALPHA = 8 * 1024 * 1024, 128, 65536, 10, 1.05
COPY_GBPS = 3000.0  # measured device-to-device copy bandwidth on H100 (docs/benchmarks.md)


def power_law(n, generator):
    x = torch.rand(n, dtype=torch.float64, device="cuda", generator=generator)
    y = (x * (ROWS ** (1 - ALPHA) - 1) + 1) ** (1 / (1 - ALPHA))
    return torch.clamp(y, max=ROWS - 1).to(torch.int64)


def main():
    lib = capi.load()
    g = torch.Generator(device="cuda").manual_seed(0)
    batches = []
    for _ in range(BATCHES):
        lengths = torch.randint(1, 11, (BAGS,), device="cuda", generator=g)
        offsets = torch.zeros(BAGS + 1, dtype=torch.int64, device="cuda")
        offsets[1:] = torch.cumsum(lengths, 0)
        batches.append((power_law(int(offsets[-1]), g), offsets))
    table = torch.randn(ROWS, DIM, device="cuda") * 0.01
    out = torch.empty(BAGS, DIM, device="cuda")
    check = torch.zeros(3, dtype=torch.int64, device="cuda")
    grad = torch.randn(BAGS, DIM, device="cuda") * 1e-3
    stream = torch.cuda.current_stream().cuda_stream
    next_batch = cycler(batches)

    def sok_forward():
        ids, offsets = next_batch()
        capi.check(lib.sok_pooled_lookup_forward(table.data_ptr(), ROWS, DIM, ids.data_ptr(),
                                                 offsets.data_ptr(), None, BAGS, len(ids), 0,
                                                 out.data_ptr(), check.data_ptr(), stream))

    def sok_train():
        ids, offsets = next_batch()
        capi.check(lib.sok_pooled_lookup_forward(table.data_ptr(), ROWS, DIM, ids.data_ptr(),
                                                 offsets.data_ptr(), None, BAGS, len(ids), 0,
                                                 out.data_ptr(), check.data_ptr(), stream))
        capi.check(lib.sok_pooled_sgd_backward(table.data_ptr(), ROWS, DIM, ids.data_ptr(),
                                               offsets.data_ptr(), None, BAGS, len(ids), 0,
                                               grad.data_ptr(), 0.01, stream))

    bag = torch.nn.EmbeddingBag(ROWS, DIM, mode="sum", sparse=True).cuda()
    optimizer = torch.optim.SGD(bag.parameters(), lr=0.01)

    def torch_forward():
        ids, offsets = next_batch()
        with torch.no_grad():
            bag(ids, offsets[:-1])

    def torch_train():
        ids, offsets = next_batch()
        optimizer.zero_grad(set_to_none=True)
        bag(ids, offsets[:-1]).backward(grad)
        optimizer.step()

    results = {"sok_forward_ms": time_ms(sok_forward), "sok_train_ms": time_ms(sok_train),
               "torch_forward_ms": time_ms(torch_forward), "torch_train_ms": time_ms(torch_train)}
    nnz = sum(len(ids) for ids, _ in batches) / BATCHES
    unique = sum(len(torch.unique(ids)) for ids, _ in batches) / BATCHES
    forward_floor = (8 * nnz + unique * DIM * 4 + BAGS * DIM * 4) / (COPY_GBPS * 1e6)
    train_floor = forward_floor + (8 * nnz + BAGS * DIM * 4 + 2 * unique * DIM * 4) / (COPY_GBPS * 1e6)
    results = {k: round(v, 4) for k, v in results.items()}
    results.update({
        "train_speedup_vs_torch": round(results["torch_train_ms"] / results["sok_train_ms"], 3),
        "forward_speedup_vs_torch": round(results["torch_forward_ms"] / results["sok_forward_ms"], 3),
        "lookups_per_batch": nnz, "unique_keys_per_batch": unique,
        "forward_floor_ms": round(forward_floor, 4), "train_floor_ms": round(train_floor, 4),
        "forward_floor_fraction": round(forward_floor / results["sok_forward_ms"], 3),
        "train_floor_fraction": round(train_floor / results["sok_train_ms"], 3),
        "target": "train <= 0.15 ms"})
    payload = {"benchmark": "G3 pooled lookup, 8Mi rows, 65536 bags U{1..10}, sum, SGD",
               "device": torch.cuda.get_device_name(), "torch": torch.__version__,
               "results": results}
    write_result("g3_pooled", payload)
    print(f"| G3 | sok fwd {results['sok_forward_ms']} ms train {results['sok_train_ms']} ms | "
          f"torch fwd {results['torch_forward_ms']} train {results['torch_train_ms']} ms | "
          f"train {results['train_speedup_vs_torch']}x | floor fraction "
          f"{results['train_floor_fraction']} |")


if __name__ == "__main__":
    main()
