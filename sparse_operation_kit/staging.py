"""A packed batch staged by the input pipeline, so a training step only copies it to the GPU.

A feature-major packed batch (one RaggedTensor [features * batch, None] of ids) crosses from
host memory to a GPU compactly: int64 ids that fit as int32 cross as int32 and row lengths
under 256 as one byte. Done inside the step, that CPU pass over the ids is on the step's path.
`stage_features` does it in the `tf.data` pipeline instead, on its threads, while earlier
steps train, into pinned memory (the counterpart of PyTorch's `DataLoader(pin_memory=True)`);
`lookup_sparse` then copies the staged bytes with one DMA and widens them on the GPU.

    dataset = dataset.map(lambda ids, labels: (sok.stage_features(ids, 26), labels),
                          num_parallel_calls=tf.data.AUTOTUNE)
    dataset = dataset.prefetch(2)   # stage last: a later map or batch would copy the bytes
    ...
    out = sok.lookup_sparse(tables, staged)   # [batch, 26, dim], as for the packed RaggedTensor
"""
import tensorflow as tf

from sparse_operation_kit._ops import raw_ops

ID_DTYPES = (tf.int32, tf.int64)  # of ids, wherever a lookup takes them


class StagedFeatures(tf.experimental.ExtensionType):
    """A packed batch of `num_features` features of ids, staged for its crossing to a GPU.

    staged: int8 bytes (pinned host memory where a GPU is present); plan: int64, where each
    feature lies in them and how it is coded. Made by `stage_features`; `lookup_sparse` takes
    it where it takes the packed RaggedTensor it was made from.
    """
    staged: tf.Tensor
    plan: tf.Tensor
    num_features: int
    id_dtype: tf.DType

    def __validate__(self):
        if self.id_dtype not in ID_DTYPES:
            raise TypeError(f"staged ids must be int32 or int64, got {self.id_dtype.name}")


def stage_features(packed_ids, num_features):
    """Stages a feature-major packed batch of ids for `lookup_sparse` on a GPU.

    Args:
      packed_ids: a 2-D RaggedTensor [num_features * batch, None] of int32 or int64 ids,
        feature-major (feature 0's samples, then feature 1's), as `lookup_sparse` takes it.
      num_features: how many features (tables) the batch holds.

    Returns:
      A `StagedFeatures`, made on the CPU. Call it as the last map of a `tf.data` pipeline
      (then prefetch), so the work is done on the pipeline's threads ahead of the step.

    Raises:
      TypeError / ValueError on a bad type, rank, dtype or feature count;
      tf.errors.InvalidArgumentError when the rows do not split into `num_features` features
      or the row splits do not run over the ids.
    """
    if not isinstance(packed_ids, tf.RaggedTensor):
        raise TypeError("stage_features takes a packed batch as one tf.RaggedTensor "
                        f"[features * batch, None], got {type(packed_ids).__name__}")
    if packed_ids.ragged_rank != 1 or packed_ids.shape.rank != 2:
        raise ValueError("a packed batch must be a 2-D RaggedTensor [features * batch, None], "
                         f"got shape {packed_ids.shape}")
    if packed_ids.dtype not in ID_DTYPES:
        raise TypeError(f"packed ids have dtype {packed_ids.dtype.name}; ids must be int32 or "
                        "int64")
    if isinstance(num_features, bool) or not isinstance(num_features, int) or num_features < 1:
        raise ValueError(f"num_features must be a positive int, got {num_features!r}")
    rows = tf.compat.dimension_value(packed_ids.shape[0])
    if rows is not None and rows % num_features != 0:
        raise ValueError(f"the packed batch holds {rows} rows, which do not split into "
                         f"{num_features} features of one batch size each")
    with tf.device("CPU:0"):
        staged, plan = raw_ops.sok_stage_features(values=packed_ids.values,
                                                  row_splits=packed_ids.row_splits,
                                                  num_features=num_features)
    return StagedFeatures(staged=staged, plan=plan, num_features=num_features,
                          id_dtype=packed_ids.dtype)


def unstage_features(staged, device, id_limits=(), table_names=()):
    """The staged batch as one (values, int64 row_splits) pair a feature, on `device`. With
    `id_limits` (each feature's table rows, -1: any id), every feature's ids are checked on
    the host, from the id ranges the plan carries, an id outside failing the op with
    InvalidArgumentError naming the table (`table_names`) and the id."""
    with tf.device(device):
        return raw_ops.sok_unpack_staged_features(staged=staged.staged, plan=staged.plan,
                                                  num_features=staged.num_features,
                                                  T=staged.id_dtype, id_limits=list(id_limits),
                                                  table_names=list(table_names))


tf.no_gradient("Sok>StageFeatures")
tf.no_gradient("Sok>UnpackStagedFeatures")
