"""Builds the op library with CMake against the installed TensorFlow and puts it in the package.

One build folder and one library per TensorFlow version (`build/tf2.15`, then
`sparse_operation_kit/lib/tf2.15/libsok_ops.so`), so venvs of several versions share a source
tree. With SOK_BUILD_CUDA=1 (nvcc on the PATH) the library also holds the GPU kernels
(`build/tf2.16-cuda`; architectures SOK_CUDA_ARCHS, default "80;90").
Incremental: a second run only re-runs the build tool, a no-op when nothing changed.
"""
import json
import os
import shutil
import subprocess
import sys

import tensorflow as tf

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TF_TAG = "tf" + ".".join(tf.__version__.split(".")[:2])
PACKAGE_LIB = os.path.join(ROOT, "sparse_operation_kit", "lib", TF_TAG)


def build(cuda=None, build_dir=None, output_dir=PACKAGE_LIB):
    if cuda is None:
        cuda = os.environ.get("SOK_BUILD_CUDA", "0") == "1"
    if build_dir is None:
        build_dir = os.path.join(ROOT, "build", TF_TAG + ("-cuda" if cuda else ""))
    os.makedirs(build_dir, exist_ok=True)
    compile_flags = ";".join(tf.sysconfig.get_compile_flags())
    # Configured once, and again when the folder was configured against another TensorFlow
    # install (a venv made again elsewhere): its headers are where the flags say.
    if cmake_cache(build_dir).get("TF_COMPILE_FLAGS") != compile_flags:
        command = [
            "cmake", "-S", ROOT, "-B", build_dir, "-DCMAKE_BUILD_TYPE=Release",
            "-DTF_COMPILE_FLAGS=" + compile_flags,
            "-DTF_LINK_FLAGS=" + ";".join(tf.sysconfig.get_link_flags()),
            "-DSOK_OUTPUT_DIR=" + os.path.join(build_dir, "lib"),
        ]
        if cuda:
            command += ["-DSOK_BUILD_CUDA=ON",
                        "-DCMAKE_CUDA_ARCHITECTURES=" + os.environ.get("SOK_CUDA_ARCHS", "80;90")]
        subprocess.check_call(command)
    jobs = str(os.cpu_count() or 2)
    subprocess.check_call(["cmake", "--build", build_dir, "-j", jobs])
    os.makedirs(output_dir, exist_ok=True)
    built = os.path.join(build_dir, "lib", "libsok_ops.so")
    target = os.path.join(output_dir, "libsok_ops.so")
    if not os.path.exists(target) or os.path.getmtime(built) > os.path.getmtime(target):
        shutil.copy2(built, target + ".tmp")
        os.replace(target + ".tmp", target)
    write_build_info(build_dir, output_dir)
    return target


def cmake_cache(build_dir):
    """CMake's cache of a build folder as {name: value} (empty before the first configure)."""
    cache = {}
    path = os.path.join(build_dir, "CMakeCache.txt")
    if os.path.exists(path):
        with open(path) as handle:
            for line in handle:
                name, _, value = line.strip().partition("=")
                cache[name.split(":")[0]] = value
    return cache


def write_build_info(build_dir, output_dir):
    """build_info.json beside the library: what `python -m sparse_operation_kit.info` reports
    about the build (the CUDA architectures and compiler are read from CMake's cache)."""
    cache = cmake_cache(build_dir)
    cuda = cache.get("SOK_BUILD_CUDA", "OFF").upper() in ("ON", "1", "TRUE")
    info = {"tensorflow": tf.__version__, "cuda": cuda,
            "cuda_archs": cache.get("CMAKE_CUDA_ARCHITECTURES") if cuda else None,
            "cuda_compiler": cache.get("CMAKE_CUDA_COMPILER") if cuda else None}
    path = os.path.join(output_dir, "build_info.json")
    with open(path + ".tmp", "w") as handle:
        json.dump(info, handle, indent=1)
    os.replace(path + ".tmp", path)


if __name__ == "__main__":
    print(build())
    sys.exit(0)
