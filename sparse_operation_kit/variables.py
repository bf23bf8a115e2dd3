"""Static embedding tables placed across workers.

`Variable` is a `tf.Variable` whose value on each worker is that worker's local shard:
- distributed: global row r lives on worker r % N at local row r // N;
- localized:K: the whole table on worker K, an empty [0, dim] variable elsewhere.
"""
import dataclasses
import re

import numpy as np
import tensorflow as tf
from tensorflow.python.ops import resource_variable_ops

from sparse_operation_kit import communication

_LOCALIZED = re.compile(r"^localized:(\d+)$")
DISTRIBUTED = -1  # `Placement.owner` of a distributed table


@dataclasses.dataclass(frozen=True)
class Placement:
    """Where the rows of a static table live."""

    owner: int  # DISTRIBUTED, or the worker holding the whole table
    num_workers: int

    def local_rows(self, global_rows, rank):
        if self.owner == DISTRIBUTED:
            return max(0, (global_rows - rank + self.num_workers - 1) // self.num_workers)
        return global_rows if rank == self.owner else 0

    def mode(self):
        return "distributed" if self.owner == DISTRIBUTED else f"localized:{self.owner}"

    def owner_of(self, ids):
        """The worker holding each of `ids` (global rows of a static table, keys of a dynamic
        one): uint64(id) % N when distributed, as the lookup kernels route them."""
        ids = np.asarray(ids, np.int64)
        if self.owner != DISTRIBUTED:
            return np.full(ids.shape, self.owner, np.int64)
        return (ids.astype(np.uint64) % np.uint64(self.num_workers)).astype(np.int64)


def parse_mode(mode, num_workers):
    """Parses SOK's `mode` string into a Placement; ValueError names the valid forms."""
    if mode is None or mode == "distributed":
        return Placement(DISTRIBUTED, num_workers)
    match = _LOCALIZED.match(mode) if isinstance(mode, str) else None
    if not match:
        raise ValueError(f"unknown mode {mode!r}; valid modes are None, 'distributed' and "
                         "'localized:K' with K a worker index")
    owner = int(match.group(1))
    if owner >= num_workers:
        raise ValueError(f"mode {mode!r} places the table on worker {owner}, but there are "
                         f"only {num_workers} workers")
    return Placement(owner, num_workers)


def _local_shard(global_value, placement, rank):
    """The rows of the global table that this worker holds, in increasing global row."""
    if placement.owner == DISTRIBUTED:
        return global_value[rank::placement.num_workers]
    if rank == placement.owner:
        return global_value
    return global_value[:0]


class PlacedTable:
    """SOK's placement attributes, from `self._placement` and `self._dimension`."""

    @property
    def placement(self):
        return self._placement

    @property
    def mode(self):
        return self._placement.mode()

    @property
    def target_gpu(self):
        return self._placement.owner

    @property
    def num_gpus(self):
        return self._placement.num_workers

    @property
    def dimension(self):
        return self._dimension


class Variable(PlacedTable, resource_variable_ops.ResourceVariable):
    """A static embedding table whose value on each worker is its local shard.

    Args:
      initial_value: the whole table, [rows, dim] (array, tensor or callable returning one);
        each worker keeps its shard of it. Or leave it None and give `shape` ([rows, dim] of the
        whole table) and `initializer` (a Keras initializer or its name), which fills only the
        local shard.
      mode: None / "distributed" (rows round-robin over workers) or "localized:K".
      Other arguments as `tf.Variable`'s, in its positional order (initial_value, trainable,
      validate_shape, caching_device, name, variable_def, dtype, import_scope, constraint,
      synchronization, aggregation, shape), as SOK passes them on.

    Attributes:
      mode, target_gpu (-1 when distributed), num_gpus, global_rows, dimension.
    """

    def __init__(self, initial_value=None, trainable=True, validate_shape=True,
                 caching_device=None, name=None, variable_def=None, dtype=None,
                 import_scope=None, constraint=None, synchronization=None, aggregation=None,
                 shape=None, initializer=None, mode=None, **kwargs):
        if variable_def is not None or import_scope is not None:
            raise ValueError("sok.Variable cannot be built from a variable_def / import_scope "
                             "(TF1 graph protos); give initial_value or shape and initializer")
        communication._require_init()
        kwargs.update(validate_shape=validate_shape, caching_device=caching_device,
                      constraint=constraint)
        if synchronization is not None:
            kwargs["synchronization"] = synchronization
        if aggregation is not None:
            kwargs["aggregation"] = aggregation
        rank, num_workers = communication.rank(), communication.num_workers()
        placement = parse_mode(mode, num_workers)
        if initial_value is not None:
            if callable(initial_value):
                initial_value = initial_value()
            global_value = tf.convert_to_tensor(initial_value, dtype=dtype)
            if global_value.shape.rank != 2:
                raise ValueError("a sok.Variable holds a [rows, dim] table, got initial value of "
                                 f"shape {global_value.shape}")
            global_rows, dim = global_value.shape
            local_value = _local_shard(global_value, placement, rank)
        else:
            if shape is None or len(shape) != 2:
                raise ValueError(f"give initial_value, or shape=[rows, dim] with an initializer; "
                                 f"got shape {shape!r}")
            global_rows, dim = int(shape[0]), int(shape[1])
            initializer = tf.keras.initializers.get(initializer or "glorot_uniform")
            local_shape = [placement.local_rows(global_rows, rank), dim]
            local_value = initializer(local_shape, dtype=dtype or tf.float32)
        self._placement = placement
        self._global_rows = int(global_rows)
        self._dimension = int(dim)
        super().__init__(initial_value=local_value, trainable=trainable, name=name,
                         dtype=dtype, **kwargs)

    @property
    def global_rows(self):
        return self._global_rows

    def global_row_ids(self):
        """The global row of each local row, as an int64 numpy array."""
        rank = communication.rank()
        if self._placement.owner == DISTRIBUTED:
            return np.arange(rank, self._global_rows, self._placement.num_workers, dtype=np.int64)
        return np.arange(self._placement.local_rows(self._global_rows, rank), dtype=np.int64)


class DistributedVariable(Variable):
    """SOK's class for `sok.Variable(..., mode="distributed")`: rows round-robin over workers."""

    def __init__(self, *args, **kwargs):
        kwargs.pop("mode", None)
        super().__init__(*args, mode="distributed", **kwargs)


class LocalizedVariable(Variable):
    """SOK's class for `sok.Variable(..., mode="localized:K")`: the table on worker
    `target_gpu`."""

    def __init__(self, *args, target_gpu=0, **kwargs):
        kwargs.pop("mode", None)
        super().__init__(*args, mode=f"localized:{int(target_gpu)}", **kwargs)
