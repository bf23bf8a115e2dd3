"""Which worker this is, how many there are, and the all-to-all between them.

`init` picks the communication tool once per process: Horovod (initialised by the caller
first, as in SOK) or a single worker.
"""
import dataclasses

import tensorflow as tf

_VALID_TOOLS = ("horovod", "single")


@dataclasses.dataclass
class _State:
    initialized: bool = False
    rank: int = 0
    num_workers: int = 1
    hvd: object = None
    use_legacy_optimizer: bool = True


_state = _State()


def init(comm_tool="horovod", use_legacy_optimizer=True):
    """Sets up sparse_operation_kit for this process.

    Args:
      comm_tool: "horovod" (call `hvd.init()` first) or "single" for one worker. With
        "horovod" but Horovod not installed, runs as a single worker.
      use_legacy_optimizer: accepted for SOK compatibility; `OptimizerWrapper` handles both
        optimizer generations.

    Raises:
      ValueError: unknown `comm_tool`.
      RuntimeError: called twice, or Horovod not initialised.
    """
    if comm_tool not in _VALID_TOOLS:
        raise ValueError(f"unknown comm_tool {comm_tool!r}; valid tools are {_VALID_TOOLS}")
    if _state.initialized:
        raise RuntimeError("sok.init() was already called in this process")
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
    _state.use_legacy_optimizer = use_legacy_optimizer
    _state.initialized = True


def is_initialized():
    return _state.initialized


def _require_init():
    if not _state.initialized:
        raise RuntimeError("call sok.init() before creating sok variables or looking them up")


def rank():
    """This worker's index in [0, num_workers())."""
    _require_init()
    return _state.rank


def num_workers():
    _require_init()
    return _state.num_workers


def alltoall(tensor, splits):
    """Sends rows `splits[w]` of `tensor` (in order) to worker w.

    Returns (received rows grouped by source worker, rows received from each worker).
    Differentiable: the gradient travels back along the same routes.
    """
    if _state.num_workers == 1:
        return tensor, splits
    return _state.hvd.alltoall(tensor, splits=splits)


def allreduce_sum(tensor):
    """Sum of `tensor` (a dense gradient, or IndexedSlices) over workers, safe inside
    tf.function.

    The input passes through Sok>Unfoldable first: on a worker with an empty local batch the
    gradient is a compile-time constant, and Grappler would otherwise run Horovod's
    allreduce while optimising that worker's graph, hanging every worker.
    """
    if _state.num_workers == 1:
        return tensor
    from sparse_operation_kit._ops import raw_ops  # noqa: PLC0415

    if isinstance(tensor, tf.IndexedSlices):  # Horovod allgathers the rows
        tensor = tf.IndexedSlices(raw_ops.sok_unfoldable(tensor.values),
                                  raw_ops.sok_unfoldable(tensor.indices), tensor.dense_shape)
        return _state.hvd.allreduce(tensor, op=_state.hvd.Sum)
    return _state.hvd.allreduce(raw_ops.sok_unfoldable(tensor), op=_state.hvd.Sum)


@tf.RegisterGradient("Sok>Unfoldable")
def _unfoldable_grad(_, grad):
    return grad
