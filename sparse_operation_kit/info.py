"""Build report: `python -m sparse_operation_kit.info`.

Prints the package version, the TensorFlow and Keras it runs with, the op library it loads,
whether that library holds GPU kernels and for which compute capabilities, whether NCCL can be
loaded for the GPU exchange, and Horovod's status. Each line is `name: value`; `--json` prints
the same as one JSON object.
"""
import argparse
import json
import os
import sys

import tensorflow as tf

from sparse_operation_kit import _ops, _versions
from sparse_operation_kit.version import __version__

BUILD_INFO = "build_info.json"  # written beside the library by scripts/build_plugin.py


def keras_version():
    """The Keras behind tf.keras: tf_keras (Keras 2) under TF_USE_LEGACY_KERAS=1 on TF 2.16+."""
    version, name = _versions.keras_behind_tf_keras()
    return f"{version} ({name})" if name else "not installed"


def gpu_kernel_ops():
    """The plugin's ops with a registered GPU kernel (the library is loaded first)."""
    from tensorflow.python.framework import kernels
    dir(_ops.raw_ops)  # loads the library
    return sorted({k.op for k in kernels.get_all_registered_kernels().kernel
                   if k.op.startswith("Sok>") and k.device_type == "GPU"})


def build_info(library):
    path = os.path.join(os.path.dirname(library), BUILD_INFO)
    if not os.path.exists(path):
        return {}
    with open(path) as handle:
        return json.load(handle)


def nccl_status(has_gpu_kernels):
    if not has_gpu_kernels:
        return "not used (the library has no GPU kernels)"
    try:
        _ops.raw_ops.sok_nccl_unique_id()
    except tf.errors.OpError as error:
        return f"not found: {error.message}"
    return "found (" + (os.environ.get("SOK_NCCL_LIBRARY") or "libnccl.so.2") + ")"


def horovod_status():
    try:
        import horovod
        import horovod.tensorflow as hvd
    except Exception as error:  # ImportError, or a Horovod built against another TensorFlow
        return f"not available ({type(error).__name__}: {str(error).splitlines()[0][:160]})"
    built = [name for name, check in (("NCCL", hvd.nccl_built), ("Gloo", hvd.gloo_built),
                                      ("MPI", hvd.mpi_built)) if check()]
    return f"{horovod.__version__} with {', '.join(built) or 'no controller'}"


def report():
    """The build report as a dict of str -> str."""
    library = _ops._LIBRARY
    facts = {"sparse_operation_kit": __version__, "python": sys.version.split()[0],
             "tensorflow": tf.__version__, "keras": keras_version(), "library": library}
    try:
        gpu_ops = gpu_kernel_ops()
    except ImportError as error:
        facts["library"] = f"{library} (not loadable: {error})"
        gpu_ops = None
    built = build_info(library)
    if gpu_ops is None:
        facts["gpu_kernels"] = "unknown (library not loaded)"
    elif gpu_ops:
        archs = built.get("cuda_archs") or "unknown (no build_info.json beside the library)"
        facts["gpu_kernels"] = f"yes, {len(gpu_ops)} ops, compute capabilities {archs}"
    else:
        facts["gpu_kernels"] = "no (CPU-only build; rebuild with SOK_BUILD_CUDA=1)"
    if built.get("cuda_compiler"):
        facts["cuda_compiler"] = built["cuda_compiler"]
    facts["gpus_visible"] = str(len(tf.config.list_physical_devices("GPU")))
    facts["nccl"] = nccl_status(bool(gpu_ops))
    facts["horovod"] = horovod_status()
    return facts


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m sparse_operation_kit.info",
                                     description=__doc__.split("\n\n")[1])
    parser.add_argument("--json", action="store_true", help="one JSON object")
    args = parser.parse_args(argv)
    facts = report()
    if args.json:
        print(json.dumps(facts, indent=1))
    else:
        for name, value in facts.items():
            print(f"{name}: {value}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
