"""Which worker this is, how many there are, and the all-to-all between them.

`init` picks the communication tool once per process: Horovod (initialised by the caller
first, as in SOK) or a single worker. With several Horovod workers that see GPUs (and an op
library built with CUDA), the lookups' all-to-alls run through the plugin's own NCCL exchange
(Sok>AllToAll on this worker's GPU, one communicator made here); otherwise through
`hvd.alltoall`. `SOK_EXCHANGE=horovod` (or `nccl`, to insist) overrides the choice.

Every worker must run the same collectives in the same order. Horovod negotiates its own
order; the NCCL exchanges are chained instead: in a graph each one gets a control dependency
on the previous one, so two lookups' exchanges never run in different orders on two workers.
"""
import dataclasses
import os
import sys
import warnings

import tensorflow as tf

from sparse_operation_kit import _versions

_VALID_TOOLS = ("horovod", "single")
_VALID_EXCHANGES = ("auto", "nccl", "horovod")


@dataclasses.dataclass
class _State:
    initialized: bool = False
    rank: int = 0
    num_workers: int = 1
    hvd: object = None
    use_legacy_optimizer: bool = True
    exchange_device: str = None  # this worker's GPU when the NCCL exchange is in use


_state = _State()


def init(comm_tool="horovod", use_legacy_optimizer=True):
    """Sets up sparse_operation_kit for this process.

    Args:
      comm_tool: "horovod" (call `hvd.init()` first) or "single" for one worker. With
        "horovod" but Horovod not installed, runs as a single worker.
      use_legacy_optimizer: as in SOK (the default), `tf.keras.optimizers.<Name>` and
        `tf.optimizers.<Name>` then name the legacy Keras optimizers, so one optimizer object
        can update sok tables through `OptimizerWrapper` in one step and `tf.Variable`s in
        another. With False nothing in TensorFlow changes (`OptimizerWrapper` handles both
        optimizer generations).

    Raises:
      ValueError: unknown `comm_tool`.
      RuntimeError: called twice, or Horovod not initialised.
    """
    if comm_tool not in _VALID_TOOLS:
        raise ValueError(f"unknown comm_tool {comm_tool!r}; valid tools are {_VALID_TOOLS}")
    if _state.initialized:
        raise RuntimeError("sok.init() was already called in this process")
    from sparse_operation_kit._ops import _load  # noqa: PLC0415

    _load()  # registers the Sok> ops, which tf.saved_model.load of a sok model needs
    hvd = None
    if comm_tool == "horovod":
        try:
            import horovod.tensorflow as hvd
        except ImportError:
            hvd = None
    if hvd is not None:
        if not hvd.is_initialized():
            raise RuntimeError("call hvd.init() before sok.init(comm_tool='horovod')")
        _state.rank, _state.num_workers, _state.hvd = hvd.rank(), hvd.size(), hvd
        _state.exchange_device = _init_gpu_exchange(hvd)
    _state.use_legacy_optimizer = use_legacy_optimizer
    if use_legacy_optimizer:
        _name_legacy_optimizers()
    _state.initialized = True


_LEGACY_OPTIMIZERS = ("Optimizer", "SGD", "Adam", "Adagrad", "Adamax", "Adadelta", "RMSprop",
                      "Ftrl", "Nadam")


def _name_legacy_optimizers():
    """What SOK's init(use_legacy_optimizer=True) does: tf.keras.optimizers.Adam and
    tf.optimizers.Adam are then the legacy (Keras 2 OptimizerV2) classes. Keras 3 has none
    (its `optimizers.legacy` names classes that raise), so under it nothing changes."""
    legacy = getattr(tf.keras.optimizers, "legacy", None)
    if legacy is None or _versions.tf_keras_is_keras_3():
        return
    for module in (tf.keras.optimizers, getattr(tf, "optimizers", None)):
        for name in _LEGACY_OPTIMIZERS:
            if module is not None and hasattr(legacy, name):
                try:
                    setattr(module, name, getattr(legacy, name))
                except AttributeError:  # a read-only lazy module: leave it
                    continue


def is_initialized():
    return _state.initialized


def _require_init():
    """Variables and lookups work without sok.init(), as in SOK: the first use initialises
    sok for Horovod when it is initialised in this process, else for a single worker."""
    if not _state.initialized:
        hvd = sys.modules.get("horovod.tensorflow")
        running = hvd is not None and hvd.is_initialized()
        init("horovod" if running else "single", use_legacy_optimizer=False)


def set_comm_tool(comm_tool):
    """SOK's name for choosing the tool before any variable exists: as `init(comm_tool)`."""
    if _state.initialized:
        raise RuntimeError(f"set_comm_tool({comm_tool!r}) after sok was initialised")
    init(comm_tool)


def rank():
    """This worker's index in [0, num_workers())."""
    _require_init()
    return _state.rank


def num_workers():
    _require_init()
    return _state.num_workers


# SOK's names (sok.communication.*): one GPU per worker, so a worker's GPU id is its rank.
num_ranks = num_gpus = num_workers
global_gpu_id = rank


def local_rank():
    """This worker's index among the workers of its host."""
    _require_init()
    return _state.hvd.local_rank() if _state.hvd is not None else 0


_REDUCE_OPS = ("sum", "average", "mean", "max", "min")


def allreduce(tensor, op="sum"):
    """`tensor` (dense, or IndexedSlices whose rows Horovod allgathers) reduced over workers:
    op "sum" (default), "average" / "mean", "max", "min" (or a Horovod op such as hvd.Sum).
    Safe inside tf.function: the input passes through Sok>Unfoldable first (on a worker with
    an empty local batch a gradient is a compile-time constant, and Grappler would otherwise
    run Horovod's allreduce while optimising that worker's graph, hanging every worker)."""
    _require_init()
    name = op if isinstance(op, str) else None
    if name is not None and name not in _REDUCE_OPS:
        raise ValueError(f"unknown allreduce op {op!r}; valid ops are {_REDUCE_OPS}")
    if _state.num_workers == 1:
        return tensor if isinstance(tensor, tf.IndexedSlices) else tf.convert_to_tensor(tensor)
    from sparse_operation_kit._ops import raw_ops  # noqa: PLC0415

    hvd = _state.hvd
    if name is not None:
        op = {"sum": hvd.Sum, "average": hvd.Average, "mean": hvd.Average, "max": hvd.Max,
              "min": hvd.Min}[name]
    if isinstance(tensor, tf.IndexedSlices):
        tensor = tf.IndexedSlices(raw_ops.sok_unfoldable(tensor.values),
                                  raw_ops.sok_unfoldable(tensor.indices), tensor.dense_shape)
    else:
        tensor = raw_ops.sok_unfoldable(tf.convert_to_tensor(tensor))
    return hvd.allreduce(tensor, op=op)


def allgather(tensor):
    """Every worker's `tensor` concatenated along axis 0, in rank order."""
    _require_init()
    if _state.num_workers == 1:
        return tf.convert_to_tensor(tensor)
    return _state.hvd.allgather(tensor)


def broadcast(tensor, root=0):
    """Worker `root`'s `tensor` on every worker."""
    _require_init()
    if _state.num_workers == 1:
        return tf.convert_to_tensor(tensor)
    return _state.hvd.broadcast(tensor, root_rank=root)


def _has_gpu_kernel(op_name):
    from tensorflow.python.framework import kernels  # noqa: PLC0415

    from sparse_operation_kit._ops import _load  # noqa: PLC0415

    _load()
    return any(kernel.device_type == "GPU"
               for kernel in kernels.get_registered_kernels_for_op(op_name).kernel)


def _exchange_choice():
    choice = os.environ.get("SOK_EXCHANGE", "auto")
    if choice not in _VALID_EXCHANGES:
        raise ValueError(f"SOK_EXCHANGE is {choice!r}; valid values are {_VALID_EXCHANGES}")
    return choice


def _init_gpu_exchange(hvd):
    """This worker's GPU (a TF device name) once its NCCL communicator exists, else None.

    A worker that sees several GPUs uses the one at its local rank (pin one per worker with
    `tf.config.set_visible_devices(gpus[hvd.local_rank()], "GPU")`, as SOK's examples do)."""
    choice = _exchange_choice()
    gpus = tf.config.list_logical_devices("GPU")
    if choice == "horovod" or hvd.size() == 1 or (choice == "auto" and not gpus):
        return None
    problem = None
    if not gpus:
        problem = "TensorFlow sees no GPU"
    elif not tf.executing_eagerly():
        problem = "sok.init() ran inside a graph"
    elif not _has_gpu_kernel("Sok>NcclInit"):
        problem = "the op library was built without CUDA (SOK_BUILD_CUDA=1)"
    if problem is None:
        device = gpus[hvd.local_rank() if len(gpus) > hvd.local_rank() and len(gpus) > 1 else 0]
        problem = _make_communicator(hvd, device.name)
        if problem is None:
            return device.name
    if choice == "nccl":
        raise RuntimeError(f"SOK_EXCHANGE=nccl but the GPU exchange is unavailable: {problem}")
    warnings.warn(f"sparse_operation_kit exchanges through hvd.alltoall: {problem}")
    return None


def _make_communicator(hvd, device):
    """Rank 0 makes a NCCL id, Horovod broadcasts it, every worker joins; returns None or,
    on every worker alike, why it could not (byte 0 of the broadcast says whether rank 0
    made an id, so no worker waits for one that never comes)."""
    from sparse_operation_kit._ops import raw_ops  # noqa: PLC0415

    made, problem = tf.zeros([129], tf.uint8), None
    if hvd.rank() == 0:
        try:
            with tf.device("/CPU:0"):
                made = tf.concat([tf.ones([1], tf.uint8), raw_ops.sok_nccl_unique_id()], 0)
        except tf.errors.OpError as error:
            problem = error.message
    with tf.device("/CPU:0"):
        made = hvd.broadcast(made, root_rank=0, name="sok_nccl_unique_id").numpy()
    if made[0] != 1:
        return problem or "rank 0 could not load NCCL"
    with tf.device(device):
        raw_ops.sok_nccl_init(tf.constant(made[1:]), rank=hvd.rank(), num_workers=hvd.size())
    return None


def _ordered(make_exchange):
    """Creates an exchange after the previous one of the same graph (eagerly, ops already
    run in program order); returns what make_exchange returns."""
    if tf.executing_eagerly():
        return make_exchange()
    graph = tf.compat.v1.get_default_graph()
    previous = getattr(graph, "_sok_last_exchange", None)
    with tf.control_dependencies([] if previous is None else [previous]):
        result = make_exchange()
    graph._sok_last_exchange = result.op
    return result


def alltoall(tensor, splits):
    """Sends rows `splits[w]` of `tensor` (in order) to worker w.

    Returns (received rows grouped by source worker, rows received from each worker).
    Differentiable: the gradient travels back along the same routes. With the NCCL exchange
    the receive counts are exchanged first (the one wait of the step: the output's size
    depends on the peers).
    """
    if _state.num_workers == 1:
        return tensor, splits
    if _state.exchange_device is None:
        return _horovod_alltoall(tensor, splits)
    from sparse_operation_kit._ops import raw_ops  # noqa: PLC0415

    with tf.device(_state.exchange_device):
        received_splits = _ordered(lambda: raw_ops.sok_all_to_all_counts(send_splits=splits))
    return alltoall_known(tensor, splits, received_splits), received_splits


def _horovod_alltoall(tensor, splits):
    """hvd.alltoall; bfloat16, which Horovod lacks, travels as float32 (exactly)."""
    if tensor.dtype != tf.bfloat16:
        return _state.hvd.alltoall(tensor, splits=splits)
    received, received_splits = _state.hvd.alltoall(tf.cast(tensor, tf.float32), splits=splits)
    return tf.cast(received, tf.bfloat16), received_splits


def alltoall_known(tensor, send_splits, recv_splits):
    """alltoall when this worker also knows what it receives (rows going back along the
    routes of an earlier alltoall): nothing waits. Returns the received rows."""
    if _state.num_workers == 1:
        return tensor
    if _state.exchange_device is None:
        return _horovod_alltoall(tensor, send_splits)[0]
    from sparse_operation_kit._ops import raw_ops  # noqa: PLC0415

    with tf.device(_state.exchange_device):
        return _ordered(lambda: raw_ops.sok_all_to_all(tensor, send_splits, recv_splits))


def exchange_device():
    """This worker's GPU when lookups exchange through NCCL, else None."""
    return _state.exchange_device


@tf.RegisterGradient("Sok>AllToAll")
def _all_to_all_grad(op, grad):
    return [alltoall_known(tf.convert_to_tensor(grad), op.inputs[2], op.inputs[1]), None, None]


tf.no_gradient("Sok>AllToAllCounts")


def allreduce_sum(tensor):
    """Sum of `tensor` (a dense gradient, or IndexedSlices) over workers, safe inside
    tf.function (see allreduce)."""
    return allreduce(tensor, "sum")


@tf.RegisterGradient("Sok>Unfoldable")
def _unfoldable_grad(_, grad):
    return grad
