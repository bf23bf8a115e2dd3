"""The markdown table of docs/benchmarks.md "Against FBGEMM TBE" from tf_vs_tbe.json:
`python3 benchmarks/gpu/tf_vs_tbe_table.py [benchmarks/results/tf_vs_tbe.json]`.
Ratios are TBE's time over sok's: on the GPU (TBE's indices on the device against sok's
`args_gpu`) and fed from the host (TBE's pinned copy against sok's best host feed)."""
import json
import sys

WORKLOADS = ["T1", "T2", "T3", "G1a", "G1b", "G2"]
FORMS = [("static", "list"), ("packed", "packed"), ("plain", "plain TF"),
         ("dynamic", "dynamic"), ("dynpacked", "dynamic packed")]
STEPS = [("fwd", "fwd"), ("train_sgd", "train SGD"), ("train_adam", "train Adam")]
FEEDS = ["args_gpu", "args", "data", "data_loop", "staged", "staged_loop"]


def rows(results):
    for workload in WORKLOADS:
        if workload not in results:
            continue
        sok, tbe = results[workload]["sok"], results[workload]["tbe"]
        for form, label in FORMS:
            prefix = "tf_plain" if form == "plain" else f"sok_{form}"
            for step, step_label in STEPS:
                times = [sok.get(f"{prefix}_{step}_{feed}_ms") for feed in FEEDS]
                if all(t is None for t in times):
                    continue
                shown = " / ".join(f"{t:.2f}" for t in times if t is not None)
                if form == "plain":
                    yield [workload, label, step_label, "", shown, "", "", "", ""]
                    continue
                device, pinned = tbe.get(f"{step}_device_ms"), tbe.get(f"{step}_pinned_ms")
                host = min(t for t in times[1:] if t is not None)
                floor = sok[f"floor_{step}_ms"]
                yield [workload, label, step_label, f"{device:.2f} / {pinned:.2f}", shown,
                       f"{device / times[0]:.2f}x", f"{pinned / host:.2f}x", f"{floor:.2f}",
                       f"{100 * floor / pinned:.0f}% / {100 * floor / host:.0f}%"]


def main(path):
    results = json.load(open(path))
    header = ["id", "sok form", "step", "TBE", "sok", "ratio on GPU", "ratio from host",
              "floor", "reached"]
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))
    for row in rows(results):
        print("| " + " | ".join(row) + " |")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "benchmarks/results/tf_vs_tbe.json")
