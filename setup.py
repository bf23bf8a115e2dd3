"""`pip install .` builds the op library with CMake against the installed TensorFlow.

TensorFlow (2.15 to 2.21; `tensorflow` or `tensorflow-cpu`) must be installed first and the build
run without isolation (`pip install --no-build-isolation .`), so the library matches the
TensorFlow it loads into.
"""
import os
import re
import sys

from setuptools import find_packages, setup
from setuptools.command.build_py import build_py


class BuildWithCMake(build_py):
    def run(self):
        sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "scripts"))
        import build_plugin  # noqa: E402  (needs TensorFlow, so imported late)

        build_plugin.build()
        super().run()


def version():
    """The version, written once in sparse_operation_kit/version.py."""
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "sparse_operation_kit",
                        "version.py")
    with open(path) as handle:
        return re.search(r'__version__ = "([^"]+)"', handle.read()).group(1)


# The distribution name differs from the PyPI projects `sparse-operation-kit` and `merlin-sok`
# (NVIDIA's); the import name is SOK's, `sparse_operation_kit`.
setup(
    name="tf-sparse-operation-kit",
    version=version(),
    license="Apache-2.0",
    description="Fused, distributed embedding lookups and dynamic tables for TensorFlow 2",
    packages=find_packages(include=["sparse_operation_kit", "sparse_operation_kit.*"]),
    package_data={"sparse_operation_kit": ["lib/*/*.so", "lib/*/build_info.json"]},
    python_requires=">=3.9",
    # No TensorFlow requirement: the build needs the user's own TensorFlow (tensorflow or
    # tensorflow-cpu, 2.15 to 2.21) installed first, and a pin here would replace a GPU one.
    # NumPy's bound is TensorFlow's own (< 2 below 2.18).
    install_requires=["numpy"],
    cmdclass={"build_py": BuildWithCMake},
)
