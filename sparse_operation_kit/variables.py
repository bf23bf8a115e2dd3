"""Static embedding tables placed across workers.

`Variable` is a `tf.Variable` whose value on each worker is that worker's local shard
(sparse_operation_kit/placement.py says which rows): distributed over the workers, or
localized:K, the whole table on worker K and an empty [0, dim] variable elsewhere.
"""
import tensorflow as tf
from tensorflow.python.ops import resource_variable_ops

from sparse_operation_kit import communication
from sparse_operation_kit.placement import parse_mode


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
            local_value = placement.local_shard(global_value, rank)
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
        return self._placement.held_rows(self._global_rows, communication.rank())


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
