"""Loads libsok_capi.so (the CUDA kernels' C ABI) for the GPU tests and benchmarks."""
import ctypes
import os

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
LIBRARY = os.environ.get("SOK_CAPI_LIB", os.path.join(ROOT, "build-gpu", "lib", "libsok_capi.so"))


def load():
    lib = ctypes.CDLL(LIBRARY)
    i64, ptr = ctypes.c_int64, ctypes.c_void_p
    lib.sok_dot_interaction_forward.argtypes = [ptr, ptr, i64, i64, i64, ptr]
    lib.sok_dot_interaction_backward.argtypes = [ptr, ptr, ptr, i64, i64, i64, ptr]
    lib.sok_dot_interaction_forward_f16.argtypes = [ptr, ptr, i64, i64, i64, ptr]
    lib.sok_dot_interaction_backward_f16.argtypes = [ptr, ptr, ptr, i64, i64, i64, ptr]
    lib.sok_pooled_lookup_forward.argtypes = [ptr, i64, i64, ptr, ptr, ptr, i64, i64,
                                              ctypes.c_int, ptr, ptr, ptr]
    lib.sok_pooled_sgd_backward.argtypes = [ptr, i64, i64, ptr, ptr, ptr, i64, i64, ctypes.c_int,
                                            ptr, ctypes.c_float, ptr]
    lib.sok_sparse_apply.argtypes = [ctypes.c_char_p, ptr, i64, ctypes.c_int, ptr, ptr, i64,
                                     i64, i64, ptr, ptr, i64, ptr]
    i32 = ctypes.c_int32
    lib.sok_partition_keys.argtypes = [ptr, ptr, ptr, i32, ptr, ptr, i32, i32, ctypes.c_int,
                                       ptr, ptr, ptr, ptr, ptr, ptr, ptr]
    return lib


def torch_and_library():
    """For a GPU test module: (torch, the loaded library), or a module-level skip saying what
    is missing (PyTorch, a CUDA device, the built library)."""
    import pytest
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device", allow_module_level=True)
    if not os.path.exists(LIBRARY):
        pytest.skip(f"{LIBRARY} is not built", allow_module_level=True)
    return torch, load()


def check(code):
    if code != 0:
        raise RuntimeError(f"CUDA error {code}")
