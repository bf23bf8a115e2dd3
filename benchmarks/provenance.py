"""Where benchmark results go and what each result file records about how it was made.

Benchmarks write to an untracked folder (`$OUT`, else `benchmarks/out/`); `benchmarks/run.py`
compares it with `benchmarks/baselines.json`, and `run.py --publish` copies it into
`benchmarks/results/`, the committed latest run. Imports neither TensorFlow nor PyTorch: it
reports the versions of whichever of them the benchmark itself imported.
"""
import importlib.metadata
import os
import platform
import shlex
import subprocess
import sys
import time

BENCHMARKS = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(BENCHMARKS)
PUBLISHED = os.path.join(BENCHMARKS, "results")
DEFAULT_OUT = os.path.join(BENCHMARKS, "out")


def out_dir():
    """The folder a benchmark writes to: $OUT if set, else benchmarks/out (created)."""
    path = os.environ.get("OUT") or DEFAULT_OUT
    os.makedirs(path, exist_ok=True)
    return path


def command():
    """The command line that is running, relative to the repository root where possible."""
    args = [os.path.relpath(a, ROOT) if os.path.isabs(a) and a.startswith(ROOT) else a
            for a in sys.argv]
    return " ".join(["python"] + [shlex.quote(a) for a in args])


def versions():
    found = {"python": platform.python_version()}
    for module in ("tensorflow", "keras", "tf_keras", "torch", "numpy", "horovod",
                   "tensorflow_recommenders_addons", "sparse_operation_kit"):
        loaded = sys.modules.get(module)
        version = getattr(loaded, "__version__", None)
        if loaded is not None and not version:  # a package without __version__: its metadata
            try:
                version = importlib.metadata.version(module.replace("_", "-"))
            except importlib.metadata.PackageNotFoundError:
                pass
        if version:
            found[module] = str(version)
    return found


def gpu_names():
    """The GPUs nvidia-smi lists, one name each, or [] on a machine without them."""
    try:
        listed = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"],
                                capture_output=True, text=True, timeout=30, check=True)
    except (OSError, subprocess.SubprocessError):
        return []
    return [line.strip() for line in listed.stdout.splitlines() if line.strip()]


def device():
    """'NVIDIA H100 80GB HBM3', '2 x NVIDIA H200', or the CPU with its core count."""
    gpus = gpu_names()
    if gpus and os.environ.get("CUDA_VISIBLE_DEVICES", None) != "":
        return gpus[0] if len(gpus) == 1 else f"{len(gpus)} x {gpus[0]}"
    return f"CPU: {cpu_model()}, {os.cpu_count()} cores"


def cpu_model():
    """The CPU's model name from /proc/cpuinfo (Linux), else the machine type."""
    try:
        with open("/proc/cpuinfo") as handle:
            for line in handle:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def stamp(payload, device_name=None, made_by=None):
    """payload with the device, versions, command (made_by, else this process's) and date of
    this run added."""
    return dict(payload, provenance={
        "device": device_name or device(), "versions": versions(),
        "command": made_by or command(),
        "date": time.strftime("%Y-%m-%d")})
