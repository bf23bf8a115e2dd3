"""Writes tf_multi_gpu.json from the parts multi_gpu_on_device.sh leaves
in $OUT: tf_multi_gpu_tf.json (G6, G6x), tf_multi_gpu_torch.json (PyTorch's all-to-all) and
tf_multi_gpu_dlrm.log (main.py's FINAL lines under "== label" headers)."""
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import provenance  # noqa: E402
import re  # noqa: E402


def dlrm_runs(log_path):
    """{label: {"samples_per_s": ..., "auc": ...}} for each run that finished."""
    runs, label = {}, None
    for line in open(log_path):
        if line.startswith("== "):
            label = line[3:].strip()
        match = re.search(r"FINAL samples_per_second=([0-9.]+) auc=([0-9.nan]+)", line)
        if match and label:
            runs[label] = {"samples_per_s": float(match.group(1)), "auc": float(match.group(2))}
    return runs


def dlrm_summary(runs, workers):
    """The summary keys: sok's best synthetic samples/s per GPU, Keras tables' on one GPU, and
    the AUC on the GPUs and on the CPUs (same generated data)."""
    def best(keep):
        rates = [run["samples_per_s"] for label, run in runs.items() if keep(label)]
        return max(rates) if rates else None
    sok = best(lambda label: "synthetic" in label and "Keras" not in label and "2 GPUs" in label)
    keras = best(lambda label: "Keras" in label and "1 GPU" in label)
    auc = {("cpu" if "CPUs" in label else "gpu"): run["auc"] for label, run in runs.items()
           if "generated data" in label}
    return {"sok_samples_per_s_per_gpu": sok and sok / workers,
            "keras_samples_per_s_per_gpu": keras, "auc": auc.get("gpu"), "auc_cpu": auc.get("cpu")}


def main(out):
    parts = json.load(open(os.path.join(out, "tf_multi_gpu_tf.json")))
    torch = json.load(open(os.path.join(out, "tf_multi_gpu_torch.json")))
    device = open(os.path.join(out, "tf_multi_gpu_device.txt")).read().split("\n")[0]
    g6, g6x = parts["G6"], parts["G6x"]
    result = {
        "device": f"{parts['workers']} x {device.split(',')[0]}",
        "G6": {key: g6[key] for key in ("step_ms", "lookup_ms", "exchange_ms", "update_ms")},
        "G6x": {size: dict(g6x[size], **torch[size],
                           sok_vs_torch=g6x[size]["sok_gbps"] / torch[size]["torch_gbps"])
                for size in g6x},
        "DLRM": {"runs": dlrm_runs(os.path.join(out, "tf_multi_gpu_dlrm.log"))},
    }
    result["DLRM"].update(dlrm_summary(result["DLRM"]["runs"], parts["workers"]))
    result["G6"]["exchange_gbps"] = g6x["64MiB"]["sok_gbps"]
    result["G6"]["torch_a2a_gbps"] = torch["64MiB"]["torch_gbps"]
    result["G6"]["anchor_8xH100_ms"] = {"torchrec_dedup": 14.88, "dynamicemb_dedup": 21.56}
    result = provenance.stamp(result, result["device"],
                              made_by="bash benchmarks/gpu/multi_gpu_on_device.sh")
    with open(os.path.join(out, "tf_multi_gpu.json"), "w") as f:
        json.dump(result, f, indent=1)
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else provenance.out_dir())
