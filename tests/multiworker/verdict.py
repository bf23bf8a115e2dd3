"""The multi-worker scripts' shared start and ending: what the suite greps for."""
import os
import sys

import tensorflow as tf

# The workers' optimizers, named as the suite names them (tests/keras_optimizers.py).
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from keras_optimizers import KERAS_3, LazyMomentum, keras_optimizer, summed_duplicates  # noqa: E402,F401


def start_worker(hvd, sok):
    """hvd.init(), one GPU per worker (where there are GPUs, as SOK's examples pin them),
    then sok.init()."""
    hvd.init()
    gpus = tf.config.list_physical_devices("GPU")
    for gpu in gpus:
        tf.config.experimental.set_memory_growth(gpu, True)
    if gpus:
        tf.config.set_visible_devices(gpus[hvd.local_rank() % len(gpus)], "GPU")
    sok.init(comm_tool="horovod")


def placement_failures(sok, tables):
    """With SOK_TEST_EXPECT_GPU=1 (the GPU machine's run): the tables must live on this
    worker's GPU and the lookups exchange through the NCCL exchange."""
    if os.environ.get("SOK_TEST_EXPECT_GPU") != "1":
        return []
    failures = []
    if sok.communication.exchange_device() is None:
        failures.append("the GPU exchange is not in use")
    for table in tables:
        if "GPU" not in table.handle.device:
            failures.append(f"{table.name} lives on {table.handle.device!r}, not the GPU")
    return failures


def report(rank, failures):
    """Prints "PASS rank=<r>", or "FAIL rank=<r>: ..." and exits non-zero."""
    if failures:
        print(f"FAIL rank={rank}: " + "; ".join(failures), flush=True)
        sys.exit(1)
    where = "GPU" if tf.config.list_logical_devices("GPU") else "CPU"
    print(f"PASS rank={rank} on {where}", flush=True)
