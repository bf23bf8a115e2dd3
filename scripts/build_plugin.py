"""Builds the op library with CMake against the installed TensorFlow and puts it in the package.

Incremental: a second run only re-runs make, which is a no-op when nothing changed.
"""
import os
import shutil
import subprocess
import sys

import tensorflow as tf

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BUILD = os.path.join(ROOT, "build")
PACKAGE_LIB = os.path.join(ROOT, "sparse_operation_kit", "lib")


def build(build_dir=BUILD, output_dir=PACKAGE_LIB):
    os.makedirs(build_dir, exist_ok=True)
    if not os.path.exists(os.path.join(build_dir, "CMakeCache.txt")):
        subprocess.check_call([
            "cmake", "-S", ROOT, "-B", build_dir, "-DCMAKE_BUILD_TYPE=Release",
            "-DTF_COMPILE_FLAGS=" + ";".join(tf.sysconfig.get_compile_flags()),
            "-DTF_LINK_FLAGS=" + ";".join(tf.sysconfig.get_link_flags()),
            "-DSOK_OUTPUT_DIR=" + os.path.join(build_dir, "lib"),
        ])
    jobs = str(os.cpu_count() or 2)
    subprocess.check_call(["cmake", "--build", build_dir, "-j", jobs])
    os.makedirs(output_dir, exist_ok=True)
    built = os.path.join(build_dir, "lib", "libsok_ops.so")
    target = os.path.join(output_dir, "libsok_ops.so")
    if not os.path.exists(target) or os.path.getmtime(built) > os.path.getmtime(target):
        shutil.copy2(built, target)


if __name__ == "__main__":
    build()
    sys.exit(0)
