"""The input stage of a lookup: the user's tables, ids and weights checked and flattened into
one `Lookup` each (ids of RaggedTensors, SparseTensors, a feature-major packed batch or a batch
staged by `sok.stage_features`), before any op chain runs; and, for the GPU, whether the ids
come from an input pipeline in host memory, where they can be checked on their way
(Sok>CheckIdsOnHost)."""
import collections

import tensorflow as tf
from tensorflow.python.framework import ops
from tensorflow.python.ops import resource_variable_ops

from sparse_operation_kit import communication, staging
from sparse_operation_kit._ops import raw_ops
from sparse_operation_kit.dynamic_variable import DynamicVariable
from sparse_operation_kit.variables import Variable

COMBINERS = ("sum", "mean", "sqrtn")


WEIGHT_DTYPES = (tf.float32, tf.float16, tf.bfloat16, tf.float64)


_TABLE_DTYPES = (tf.float32, tf.float16, tf.bfloat16)  # of static tables


class Lookup(collections.namedtuple("Lookup",
                                     "table ids row_splits weights combiner one_id")):
    """One lookup after validation: flat ids, row_splits (int64), flat weights (or None), and
    one_id: True when every sample is known, at trace time, to hold exactly one id."""


def _as_list(value, what):
    if isinstance(value, (list, tuple)):
        return list(value)
    raise TypeError(f"{what} must be a list, got {type(value).__name__}")


def _sparse_row_splits(sparse, names):
    """Row splits of the lookups' SparseTensors, in one op (Sok>SparseRowSplits) from the first
    column of their indices; columns are not read. On the CPU rows out of order or outside
    dense_shape[0] are refused (tf.RaggedTensor.from_sparse per tensor, about ten ops, cost
    8 ms a step more at 26 lookups of 8192 samples); on a GPU the op searches the row ids and
    checks nothing (a check would make every step wait for the device; entries out of order
    give wrong rows, as TF's own GPU lookups do). A batch size known when traced replaces
    dense_shape (read in host memory) and stays known downstream."""
    if not sparse:
        return []
    shapes = []
    for s in sparse:
        rows = tf.compat.dimension_value(s.shape[0])
        shapes.append(s.dense_shape if rows is None else tf.constant([rows, 0], tf.int64))
    made = raw_ops.sok_sparse_row_splits(indices=[s.indices for s in sparse], dense_shape=shapes,
                                         names=names)
    for row_splits, s in zip(made, sparse):
        rows = tf.compat.dimension_value(s.shape[0])
        if rows is not None:
            row_splits.set_shape([rows + 1])
    return list(made)


def _flatten_ids(sp_ids, index):
    """(ids, row_splits, one_id); row_splits is None for a SparseTensor, whose row splits
    validate_lookups makes for all such lookups at once."""
    if isinstance(sp_ids, tf.RaggedTensor):
        if sp_ids.ragged_rank != 1 or sp_ids.shape.rank != 2:
            raise ValueError(f"sp_ids[{index}] must be a 2-D RaggedTensor [batch, None], got "
                             f"shape {sp_ids.shape}")
        ragged = sp_ids
    elif isinstance(sp_ids, tf.SparseTensor):
        if sp_ids.shape.rank is not None and sp_ids.shape.rank != 2:
            raise ValueError(f"sp_ids[{index}] must be a 2-D SparseTensor, got rank "
                             f"{sp_ids.shape.rank}")
        _check_id_dtype(sp_ids.dtype, index)
        return sp_ids.values, None, False
    else:
        raise TypeError(f"sp_ids[{index}] must be a tf.SparseTensor or tf.RaggedTensor, got "
                        f"{type(sp_ids).__name__}")
    _check_id_dtype(ragged.dtype, index)
    one_id = (ragged.uniform_row_length is not None and
              tf.get_static_value(ragged.uniform_row_length) == 1)
    return ragged.values, tf.cast(ragged.row_splits, tf.int64), bool(one_id)


def _check_id_dtype(dtype, index):
    if dtype not in staging.ID_DTYPES:
        raise TypeError(f"sp_ids[{index}] has dtype {dtype.name}; ids must be int32 or int64")


def _flatten_weights(sp_weights, index):
    if sp_weights is None:
        return None
    if isinstance(sp_weights, tf.RaggedTensor):
        values = sp_weights.values
    elif isinstance(sp_weights, tf.SparseTensor):
        values = sp_weights.values
    else:
        raise TypeError(f"sp_weights[{index}] must be a tf.SparseTensor or tf.RaggedTensor like "
                        f"its ids, got {type(sp_weights).__name__}")
    if values.dtype not in WEIGHT_DTYPES:
        raise TypeError(f"sp_weights[{index}] has dtype {values.dtype.name}; weights must be "
                        "float32, float16, bfloat16 or float64")
    return tf.cast(values, tf.float32)  # pooling sums in float32 whatever the weights' type


def check_table(param, index):
    if isinstance(param, DynamicVariable):
        return
    if not isinstance(param, resource_variable_ops.BaseResourceVariable):
        raise TypeError(f"params[{index}] must be a sok.Variable or tf.Variable, got "
                        f"{type(param).__name__}")
    if param.dtype not in _TABLE_DTYPES:
        raise TypeError(f"params[{index}] ({param.name}) has dtype {param.dtype.name}; tables "
                        "must be float32, float16 or bfloat16")
    if param.shape.rank != 2:
        raise ValueError(f"params[{index}] ({param.name}) must be a [rows, dim] table, got shape "
                         f"{param.shape}")


def placement_attrs(table):
    """(global rows, owner) of a table; a plain tf.Variable is replicated on every worker."""
    if isinstance(table, DynamicVariable):
        return 0, table.placement.owner
    if isinstance(table, Variable):
        return table.global_rows, table.placement.owner
    return int(table.shape[0]), communication.rank()


def validate_lookups(params, sp_ids, sp_weights, combiners):
    params = _as_list(params, "params")
    sp_ids = _as_list(sp_ids, "sp_ids")
    if len(params) != len(sp_ids):
        raise ValueError(f"params has {len(params)} tables but sp_ids has {len(sp_ids)} entries; "
                         "give one ids tensor per table")
    if combiners is None:
        combiners = ["mean"] * len(params)
    combiners = _as_list(combiners, "combiners")
    if len(combiners) != len(params):
        raise ValueError(f"combiners has {len(combiners)} entries for {len(params)} lookups")
    for i, combiner in enumerate(combiners):
        if combiner not in COMBINERS:
            raise ValueError(f"combiners[{i}] is {combiner!r}; valid combiners are {COMBINERS}")
    sp_weights = [None] * len(params) if sp_weights is None else _as_list(sp_weights, "sp_weights")
    if len(sp_weights) != len(params):
        raise ValueError(f"sp_weights has {len(sp_weights)} entries for {len(params)} lookups")
    lookups = []
    for i, (param, ids, weights, combiner) in enumerate(zip(params, sp_ids, sp_weights, combiners)):
        check_table(param, i)
        values, row_splits, one_id = _flatten_ids(ids, i)
        lookups.append(Lookup(param, values, row_splits, _flatten_weights(weights, i), combiner,
                               one_id))
    # SparseTensors' row splits: one op for the lookups of CPU tables (checked there), one
    # for those of GPU tables, each placed with its tables.
    for on_gpu in (False, True):
        pending = [i for i, lookup in enumerate(lookups)
                   if lookup.row_splits is None and table_on_gpu(lookup.table) == on_gpu]
        if not pending:
            continue
        with tf.device(lookups[pending[0]].table.handle.device if on_gpu else "/device:CPU:0"):
            made = _sparse_row_splits([sp_ids[i] for i in pending],
                                      [f"sp_ids[{i}]" for i in pending])
        for i, row_splits in zip(pending, made):
            lookups[i] = lookups[i]._replace(row_splits=row_splits)
    return lookups


def on_gpu_device(tensor):
    """Whether `tensor` (a table's handle, an op's input) is placed on a GPU."""
    return "GPU" in tensor.device.upper()


def table_on_gpu(table):
    return on_gpu_device(table.handle)


def unpack_features(packed, num_features, tables, what, row_splits=None):
    """A feature-major packed RaggedTensor [features * batch, None] as one RaggedTensor a
    feature (Sok>UnpackFeatures, placed with the tables; the values are not copied where
    aligned). With row_splits (the ids'), only the values are taken from `packed`."""
    if packed.ragged_rank != 1 or packed.shape.rank != 2:
        raise ValueError(f"{what} of a packed batch must be a 2-D RaggedTensor "
                         f"[features * batch, None], got shape {packed.shape}")
    if what != "sp_weights":
        if packed.dtype not in staging.ID_DTYPES:
            raise TypeError(f"{what} of a packed batch have dtype {packed.dtype.name}; ids "
                            "must be int32 or int64")
    elif packed.dtype not in WEIGHT_DTYPES:
        raise TypeError(f"{what} has dtype {packed.dtype.name}; weights must be float32, "
                        "float16, bfloat16 or float64")
    rows = tf.compat.dimension_value(packed.shape[0])
    if rows is not None and rows % num_features != 0:
        raise ValueError(f"{what} holds {rows} rows, which do not split into {num_features} "
                         "features of one batch size each (feature-major: feature 0's samples, "
                         "then feature 1's)")
    on_gpu = any(table_on_gpu(table) for table in tables)
    device = next(t.handle.device for t in tables if table_on_gpu(t)) if on_gpu else "CPU:0"
    unpack = (raw_ops.sok_unpack_features_from_host
              if on_gpu and _in_host_memory(packed.values) else raw_ops.sok_unpack_features)
    with tf.device(device):
        values, splits = unpack(values=packed.values, row_splits=packed.row_splits,
                                num_features=num_features)
    if row_splits is not None:
        splits = row_splits
    return [tf.RaggedTensor.from_row_splits(v, r, validate=False) for v, r in zip(values, splits)]


def unstage_features(staged, tables, weights):
    """A batch staged by `sok.stage_features` as one RaggedTensor a feature, on the tables'
    device; each static table's ids checked on the host (the plan carries each feature's id
    range), so no step waits for the device to check them."""
    if staged.num_features != len(tables):
        raise ValueError(f"the staged batch holds {staged.num_features} features but "
                         f"{len(tables)} tables were given")
    if weights is not None:
        raise ValueError("a staged batch takes no sp_weights; pass the packed RaggedTensor "
                         "to weight its ids")
    device = next((t.handle.device for t in tables if table_on_gpu(t)), "CPU:0")
    id_limits = [-1 if isinstance(t, DynamicVariable) else placement_attrs(t)[0]
                 for t in tables]
    values, splits = staging.unstage_features(staged, device, id_limits,
                                              [t.name for t in tables])
    return [tf.RaggedTensor.from_row_splits(v, r, validate=False) for v, r in zip(values, splits)]


# Ops whose outputs are in host memory: an input pipeline's. A function's argument
# (Placeholder) counts as one: batches reach a training step from tf.data in host memory.


_HOST_PRODUCERS = ("IteratorGetNext", "IteratorGetNextSync", "OptionalGetValue",
                   "RaggedTensorFromVariant", "Placeholder", "ParseExample", "ParseExampleV2")


def _in_host_memory(tensor):
    """Whether a packed batch arrives in host memory: then it crosses to the GPU through
    Sok>UnpackFeaturesFromHost (feature offsets read on the host, staged compactly in pinned
    memory) instead of TensorFlow's copies from pageable memory."""
    if isinstance(tensor, ops.EagerTensor):
        return "CPU" in tensor.device.upper()
    op = tensor.op
    while op.type == "Identity" and op.inputs:
        op = op.inputs[0].op
    if op.device:
        return "CPU" in op.device.upper()
    return op.type in _HOST_PRODUCERS


def _from_input_pipeline(tensor):
    """Whether `tensor` is in host memory as an input pipeline hands it over (an iterator's
    element, an eager CPU tensor); a function's argument may be on a device, so it is not."""
    if isinstance(tensor, ops.EagerTensor):
        return "CPU" in tensor.device.upper()
    return tensor.op.type != "Placeholder" and _in_host_memory(tensor)


# The most lookups of one call whose ids are checked on the host. The host pass runs beside
# the lookup and the step waits for the longer of the two; for 26 tables' ids (T1's list
# form) the pass cost more than the GPU's own check on an H100.
HOST_CHECK_MAX_LOOKUPS = 4


def host_verdict(lookups, with_row_splits=False):
    """The lookups' ids checked against their static tables in host memory, beside the lookup
    that reads them (Sok>CheckIdsOnHost, copy=False), where every lookup's ids come from an
    input pipeline and they are few; then no step waits for, or runs, the GPU's own check.
    (verdict, row_splits_checked): the check's outputs, which the lookup's outputs are to wait
    for (after_verdict), and whether the row splits were checked too (with_row_splits and all
    from the pipeline). (None, False) otherwise."""
    if len(lookups) > HOST_CHECK_MAX_LOOKUPS:
        return None, False
    if not all(_from_input_pipeline(lookup.ids) for lookup in lookups):
        return None, False
    with_row_splits = with_row_splits and all(
        _from_input_pipeline(lookup.row_splits) for lookup in lookups)
    dtypes = {lookup.ids.dtype for lookup in lookups}
    with tf.device("CPU:0"):  # ids of one dtype checked as they are
        ids, row_splits = raw_ops.sok_check_ids_on_host(
            ids=[lookup.ids if len(dtypes) == 1 else tf.cast(lookup.ids, tf.int64)
                 for lookup in lookups],
            row_splits=[lookup.row_splits for lookup in lookups] if with_row_splits else [],
            rows=[placement_attrs(lookup.table)[0] for lookup in lookups],
            table_names=[lookup.table.name for lookup in lookups], copy=False)
    return ids + row_splits, with_row_splits


def after_verdict(verdict, outputs):
    """`outputs`, available once the host's verdict passed: a bad id fails the step before
    anything reads them (a GPU lookup reads no row outside its table meanwhile). Eagerly the
    check has run already."""
    if tf.executing_eagerly():
        return outputs
    with tf.control_dependencies([t.op for t in verdict]):
        return [tf.identity(output) for output in outputs]
