"""PyTorch's NCCL all_to_all_single at G6x's sizes, for the ratio in tf_multi_gpu.json.
Run with `torchrun --nproc_per_node N` (not in a TensorFlow process: the image's PyTorch needs
NumPy 2). Rank 0 writes tf_multi_gpu_torch.json to $OUT."""
import json
import os

import torch
import torch.distributed as dist


def main():
    dist.init_process_group("nccl")
    rank = dist.get_rank()
    torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    result = {}
    for mib in (16, 64):
        x = torch.rand(mib * 2 ** 20 // 4, device="cuda")
        y = torch.empty_like(x)
        for _ in range(5):
            dist.all_to_all_single(y, x)
        samples = []
        for _ in range(5):
            torch.cuda.synchronize()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(20):
                dist.all_to_all_single(y, x)
            end.record()
            torch.cuda.synchronize()
            ms = torch.tensor([start.elapsed_time(end) / 20], device="cuda")
            dist.all_reduce(ms, op=dist.ReduceOp.MAX)
            samples.append(ms.item())
        ms = sorted(samples)[len(samples) // 2]
        result[f"{mib}MiB"] = {"torch_ms": ms, "torch_gbps": mib * 2 ** 20 / ms / 1e6}
    if rank == 0:
        print("torch", json.dumps(result), flush=True)
        with open(os.path.join(os.environ.get("OUT", "benchmarks/out"),
                               "tf_multi_gpu_torch.json"), "w") as f:
            json.dump(result, f, indent=1)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
