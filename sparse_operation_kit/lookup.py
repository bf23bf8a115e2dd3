"""The fused, distributed embedding lookup.

One step of a group of tables sharing a dimension reads top to bottom (see _fused_group):
  input distribution   Sok>PartitionKeys: dedup per table, route each key to its owner
                       alltoall of the packed keys
  compute              Sok>GatherShardRows: the owner reads rows from its local shards
  output distribution  alltoall of the rows back to the workers that asked
                       Sok>CombineForward: pool each sample's rows with its combiner
Backward is autodiff of the same chain (lookup_gradients.py): CombineBackward, alltoall back to
the owners, SplitGradientByTable into one IndexedSlices per table.
With one worker the exchanges are skipped; the keys then arrive grouped by table, so the
gradient of each table is a block of the rows' gradient, handed out without a copy. On one
worker with static tables, unweighted ids and exactly one id per sample known at trace time
(DLRM's categorical features as uniform ragged tensors), Sok>GatherSingleIds reads the rows
straight from the tables instead, with no dedup, and the gradients are the outputs' own.
On one worker with static float32 tables on a GPU, Sok>PoolFromTables pools each sample's
rows straight from the tables whatever its ids (no dedup, sort or host wait); the gradients
are IndexedSlices over the ids (Sok>SpreadPooledGrad).
Static tables deduplicate through a bitmap, so each table's keys are sorted and the gather
reads the shard in increasing row order; pooling then reads the compact gathered rows.
"""
import collections

import tensorflow as tf
from tensorflow.python.eager import record
from tensorflow.python.framework import ops
from tensorflow.python.ops import resource_variable_ops

from sparse_operation_kit import communication, id_checks, staging
from sparse_operation_kit._ops import raw_ops
from sparse_operation_kit.dynamic_variable import DynamicVariable
from sparse_operation_kit.placement import DISTRIBUTED
from sparse_operation_kit.variables import Variable

COMBINERS = ("sum", "mean", "sqrtn")
_WEIGHT_DTYPES = (tf.float32, tf.float16, tf.bfloat16, tf.float64)
_TABLE_DTYPES = (tf.float32, tf.float16, tf.bfloat16)  # of static tables


class _Lookup(collections.namedtuple("_Lookup",
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
    _validate makes for all such lookups at once."""
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
    if values.dtype not in _WEIGHT_DTYPES:
        raise TypeError(f"sp_weights[{index}] has dtype {values.dtype.name}; weights must be "
                        "float32, float16, bfloat16 or float64")
    return tf.cast(values, tf.float32)  # pooling sums in float32 whatever the weights' type


def _check_table(param, index):
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


def _placement_attrs(table):
    """(global rows, owner) of a table; a plain tf.Variable is replicated on every worker."""
    if isinstance(table, DynamicVariable):
        return 0, table.placement.owner
    if isinstance(table, Variable):
        return table.global_rows, table.placement.owner
    return int(table.shape[0]), communication.rank()


def _validate(params, sp_ids, sp_weights, combiners):
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
        _check_table(param, i)
        values, row_splits, one_id = _flatten_ids(ids, i)
        lookups.append(_Lookup(param, values, row_splits, _flatten_weights(weights, i), combiner,
                               one_id))
    # SparseTensors' row splits: one op for the lookups of CPU tables (checked there), one
    # for those of GPU tables, each placed with its tables.
    for on_gpu in (False, True):
        pending = [i for i, lookup in enumerate(lookups)
                   if lookup.row_splits is None and _table_on_gpu(lookup.table) == on_gpu]
        if not pending:
            continue
        with tf.device(lookups[pending[0]].table.handle.device if on_gpu else "/device:CPU:0"):
            made = _sparse_row_splits([sp_ids[i] for i in pending],
                                      [f"sp_ids[{i}]" for i in pending])
        for i, row_splits in zip(pending, made):
            lookups[i] = lookups[i]._replace(row_splits=row_splits)
    return lookups


def _output_dtype(table):
    """A static table's lookups come out in its dtype (pooled in float32, rounded once), as
    tf.nn.safe_embedding_lookup_sparse's do; dynamic tables' rows read as float32 whatever
    their storage."""
    return tf.float32 if isinstance(table, DynamicVariable) else table.dtype


def _group_tables(lookups):
    """{(dim, dynamic, dtype): [lookup index, ...]} in first-seen order: one op chain per
    group."""
    groups = collections.OrderedDict()
    for i, lookup in enumerate(lookups):
        key = (int(lookup.table.shape[1]), isinstance(lookup.table, DynamicVariable),
               _output_dtype(lookup.table))
        groups.setdefault(key, []).append(i)
    return groups


def _unique_tables(lookups):
    """(the lookups' tables, each once, in first-seen order; each lookup's index among them)."""
    index = {}
    for lookup in lookups:
        index.setdefault(id(lookup.table), (len(index), lookup.table))
    tables = [table for _, table in index.values()]
    return tables, [index[id(lookup.table)][0] for lookup in lookups]


def _partition_keys(ids, lookup_table, tables, dynamic):
    """Sok>PartitionKeys over the group's tables: (send keys, splits, position)."""
    placements = [_placement_attrs(table) for table in tables]
    return raw_ops.sok_partition_keys(
        ids=ids, lookup_table=lookup_table, table_rows=[rows for rows, _ in placements],
        table_owner=[owner if owner != DISTRIBUTED else -1 for _, owner in placements],
        table_names=[table.name for table in tables], num_workers=communication.num_workers(),
        table_dynamic=[dynamic] * len(tables), pair_keys=dynamic)


def _fused_group(lookups, dim, dynamic=False, training=True, low_frequency_filter=False,
                 compress=False, dtype=tf.float32):
    """Runs the op chain for lookups whose tables share `dim` (and, static, `dtype`); returns
    one output each. 16-bit static tables: their rows are gathered and exchanged as they are
    stored, pooled in float32, and the outputs rounded to `dtype` once."""
    tables, lookup_table = _unique_tables(lookups)
    for table in tables:  # so GradientTape and tf.function see the tables being read
        resource_variable_ops.variable_accessed(table)
    # int64 ids: TensorFlow keeps int32 tensors of GPU kernels in host memory.
    ids = [tf.cast(lookup.ids, tf.int64) for lookup in lookups]

    # Input distribution.
    send_keys, splits, position, _ = _partition_keys(ids, lookup_table, tables, dynamic)
    row_splits = [lookup.row_splits for lookup in lookups]
    empty = tf.zeros([0], tf.float32)
    weights = [empty if lookup.weights is None else lookup.weights for lookup in lookups]
    combiners = [lookup.combiner for lookup in lookups]
    # Positions and keys come from Sok>PartitionKeys, row_splits from RaggedTensors: only
    # user weights still need the combine ops' checks (see Sok>CombineForward's validate).
    validate = any(lookup.weights is not None for lookup in lookups)
    if not dynamic and dtype == tf.float32 and communication.num_workers() == 1:
        # Nothing to exchange: pool each sample's rows straight from the shards.
        return raw_ops.sok_combine_from_shards(
            shards=[table.handle for table in tables], keys=send_keys, position=position,
            row_splits=row_splits, weights=weights, combiners=combiners, dtype=tf.float32,
            dim=dim, validate=validate)
    received_keys, received_splits = communication.alltoall(send_keys, splits)
    # Compute on the owner.
    if dynamic:
        admit = [table.filter_ratio if low_frequency_filter else 1.0 for table in tables]
        rows = raw_ops.sok_dynamic_gather_rows(
            tables=[table.handle for table in tables], keys=received_keys, dim=dim,
            insert=training, admit_probability=admit, validate=False)
    else:
        rows = raw_ops.sok_gather_shard_rows(
            shards=[table.handle for table in tables], keys=received_keys, dtype=dtype,
            dim=dim)
    # Output distribution (with compress, vectors and their gradients travel as float16).
    # The rows go back along the keys' routes: each worker knows what it receives.
    if dtype != tf.float32:  # 16-bit rows travel as stored
        rows = tf.cast(communication.alltoall_known(rows, received_splits, splits), tf.float32)
    elif compress and communication.num_workers() > 1:
        rows = communication.alltoall_known(tf.cast(rows, tf.float16), received_splits, splits)
        rows = tf.cast(rows, tf.float32)
    else:
        rows = communication.alltoall_known(rows, received_splits, splits)
    outputs = raw_ops.sok_combine_forward(rows=rows, position=position, row_splits=row_splits,
                                          weights=weights, combiners=combiners,
                                          validate=validate)
    return outputs if dtype == tf.float32 else [tf.cast(output, dtype) for output in outputs]


def _single_id_candidates(lookups, dynamic):
    """Whether a group may skip dedup and exchange when each sample holds one id: one worker,
    static tables, no weights (one unweighted row pools to itself under every combiner)."""
    return (not dynamic and communication.num_workers() == 1 and
            all(lookup.weights is None for lookup in lookups))


def _single_id_group(lookups, dim):
    """Sok>GatherSingleIds: each output is its table's rows at the ids; gradients are the
    outputs' gradients as IndexedSlices over the ids, as for tf.gather."""
    tables = [lookup.table for lookup in lookups]
    for table in {id(t): t for t in tables}.values():
        resource_variable_ops.variable_accessed(table)
    checked = _ids_checked_on_host(lookups)
    ids = [tf.cast(i, tf.int64)  # int64: as _fused_group
           for i in (checked or [lookup.ids for lookup in lookups])]
    names = [t.name for t in tables]
    outputs, check = raw_ops.sok_gather_single_ids(
        tables=[t.handle for t in tables], ids=ids,
        row_splits=[lookup.row_splits for lookup in lookups], dtype=tf.float32, dim=dim,
        table_names=names)
    # Reports an out-of-range id (stateful: it runs in a tf.function even though nothing reads
    # it); on the GPU the gather itself does not wait for that verdict, nor the step where the
    # ids were checked on the host.
    raw_ops.sok_check_gathered_ids(check, table_names=names,
                                   deferred=checked is not None or id_checks.mode() == "deferred")
    return outputs


def _pools_from_tables(lookups, dynamic):
    """Whether a group pools straight from its tables: one worker, static float32 tables,
    all on a GPU, where the fused chain's dedup would wait for the device every step."""
    return (not dynamic and communication.num_workers() == 1 and
            all(_table_on_gpu(lookup.table) and lookup.table.dtype == tf.float32
                for lookup in lookups))


def _pool_from_tables(lookups, dim, stacked=False, ids_checked=False):
    """Sok>PoolFromTables: each sample's weighted rows pooled straight from its table, with no
    dedup, sort or exchange, so nothing waits for the device; the gradients are IndexedSlices
    over the ids (Sok>SpreadPooledGrad), repeats summed by the update. With stacked, one
    [batch, lookups, dim] output for all the lookups. With ids checked on the host (a staged
    batch's, or any from an input pipeline: _ids_checked_on_host), the device's own check of
    the ids is deferred, as in the "deferred" mode: the step does not wait for it."""
    tables = [lookup.table for lookup in lookups]
    for table in {id(t): t for t in tables}.values():
        resource_variable_ops.variable_accessed(table)
    names = [t.name for t in tables]
    empty = tf.zeros([0], tf.float32)
    checked = None if ids_checked else _ids_checked_on_host(lookups)
    ids_checked = ids_checked or checked is not None
    outputs, check = raw_ops.sok_pool_from_tables(
        tables=[t.handle for t in tables],
        ids=[tf.cast(i, tf.int64) for i in (checked or [l.ids for l in lookups])],
        row_splits=[lookup.row_splits for lookup in lookups],
        weights=[empty if lookup.weights is None else lookup.weights for lookup in lookups],
        num_outputs=1 if stacked else len(lookups), stacked=stacked,
        combiners=[lookup.combiner for lookup in lookups], dim=dim, table_names=names)
    raw_ops.sok_check_gathered_ids(check, table_names=names,
                                   deferred=ids_checked or id_checks.mode() == "deferred")
    return outputs


def _dynamic_direct_group(lookups, dim, training):
    """Dynamic tables on one worker: each lookup reads its table's rows at its ids
    (Sok>DynamicTableLookup, find-or-insert; repeated ids are found, not deduplicated first),
    then Sok>CombineForward pools them, unless every sample holds one id and no weights.
    Nothing to partition or exchange; gradients are IndexedSlices over the ids, repeats
    summed by the update."""
    for table in {id(lookup.table): lookup.table for lookup in lookups}.values():
        resource_variable_ops.variable_accessed(table)
    rows = [raw_ops.sok_dynamic_table_lookup(lookup.table.handle, tf.cast(lookup.ids, tf.int64),
                                             dim=dim, insert=training)
            for lookup in lookups]
    if all(lookup.one_id and lookup.weights is None for lookup in lookups):
        return rows
    all_rows = rows[0] if len(rows) == 1 else tf.concat(rows, 0)
    position = tf.cast(tf.range(tf.shape(all_rows, out_type=tf.int64)[0]), tf.uint32)
    empty = tf.zeros([0], tf.float32)
    return raw_ops.sok_combine_forward(
        rows=all_rows, position=position, row_splits=[lookup.row_splits for lookup in lookups],
        weights=[empty if lookup.weights is None else lookup.weights for lookup in lookups],
        combiners=[lookup.combiner for lookup in lookups],
        validate=any(lookup.weights is not None for lookup in lookups))


def _one_id_at_run_time(lookups):
    """A scalar bool tensor: every sample of every lookup holds exactly one id (row_splits
    is 0, 1, 2, ...). One op over the row splits, no pass over the ids."""
    return raw_ops.sok_every_sample_holds_one_id(
        row_splits=[lookup.row_splits for lookup in lookups])


def on_gpu_device(tensor):
    """Whether `tensor` (a table's handle, an op's input) is placed on a GPU."""
    return "GPU" in tensor.device.upper()


def _table_on_gpu(table):
    return on_gpu_device(table.handle)


def _on_gpu(lookups):
    return any(_table_on_gpu(lookup.table) for lookup in lookups)


def _either_id_path_group(lookups, dim):
    """One worker, static tables, no weights, ids of unknown lengths (RaggedTensors from
    row lengths, SparseTensors): when every sample turns out to hold one id, the rows come
    straight from the tables as in _single_id_group, and the gradients are the outputs' own
    (no dedup, no sort, no copy); otherwise the fused chain runs. The choice is made per step
    by a tf.cond inside a custom gradient, so the tables' gradients stay IndexedSlices on both
    branches (a tf.cond that autodiff differentiates would make them dense)."""
    tables, lookup_table = _unique_tables(lookups)
    for table in tables:
        resource_variable_ops.variable_accessed(table)
    names = [table.name for table in tables]
    ids = [tf.cast(lookup.ids, tf.int64) for lookup in lookups]
    row_splits = [lookup.row_splits for lookup in lookups]
    combiners = [lookup.combiner for lookup in lookups]
    empty_keys = _unknown_rows(tf.zeros([0], tf.int64))
    empty_position = _unknown_rows(tf.zeros([0], tf.uint32))

    @tf.custom_gradient
    def pooled(*handles):
        one_id = _one_id_at_run_time(lookups)

        def rows_of_single_ids():
            outputs, check = raw_ops.sok_gather_single_ids(
                tables=[handles[t] for t in lookup_table], ids=ids, row_splits=row_splits,
                dtype=tf.float32, dim=dim, table_names=[names[t] for t in lookup_table])
            checked = raw_ops.sok_check_gathered_ids(
                check, table_names=[names[t] for t in lookup_table])
            with tf.control_dependencies([] if checked is None else [checked]):
                return list(outputs), empty_keys, empty_position, tf.constant(True)

        def rows_of_fused_chain():
            keys, _, position, _ = _partition_keys(ids, lookup_table, tables, dynamic=False)
            outputs = raw_ops.sok_combine_from_shards(
                shards=list(handles), keys=keys, position=position, row_splits=row_splits,
                weights=[tf.zeros([0], tf.float32)] * len(lookups), combiners=combiners,
                dtype=tf.float32, dim=dim, validate=False)
            return list(outputs), keys, position, tf.constant(True)

        with record.stop_recording():  # the custom gradient is the only one the tape needs
            outputs, keys, position, checked = tf.cond(one_id, rows_of_single_ids,
                                                       rows_of_fused_chain)

        def grad(*output_grads):
            output_grads = [tf.zeros_like(o) if g is None else tf.convert_to_tensor(g)
                            for o, g in zip(outputs, output_grads)]

            def grads_of_single_ids():  # the outputs' own gradients, over the ids
                per_table = [[l for l, t in enumerate(lookup_table) if t == table]
                             for table in range(len(tables))]
                return ([_unknown_rows(_concat([ids[l] for l in members]))
                         for members in per_table],
                        [_unknown_rows(_concat([output_grads[l] for l in members]))
                         for members in per_table])

            def grads_of_fused_chain():
                rows_grad = raw_ops.sok_combine_backward(
                    output_grads=output_grads, position=position, row_splits=row_splits,
                    weights=[tf.zeros([0], tf.float32)] * len(lookups),
                    num_rows=tf.size(keys, out_type=tf.int64), combiners=combiners,
                    validate=False)
                indices, values = raw_ops.sok_split_gradient_by_table(
                    keys=keys, grad=rows_grad, table_counts=_table_counts_of(keys),
                    num_tables=len(tables))
                return list(indices), list(values)

            with tf.control_dependencies([checked]):  # no update from ids out of range
                indices, values = tf.cond(one_id, grads_of_single_ids, grads_of_fused_chain)
            return [tf.IndexedSlices(v, id_checks.checked(i), dense_shape=tf.raw_ops.VariableShape(
                        input=handle, out_type=tf.int64))
                    for i, v, handle in zip(indices, values, handles)]

        return outputs, grad

    return pooled(*[table.handle for table in tables])


def _unknown_rows(tensor):
    """tensor, its first dimension statically unknown (no copy). A tf.cond that a tape
    differentiates gives its outputs the static shapes of its true branch, so a branch's
    outputs whose lengths differ between the branches must not state one."""
    return tf.compat.v1.placeholder_with_default(tensor, [None] + tensor.shape.as_list()[1:])


def _concat(tensors):
    return tensors[0] if len(tensors) == 1 else tf.concat(tensors, 0)


def _lookup_group(lookups, dim, dynamic, training, low_frequency_filter, compress,
                  dtype=tf.float32):
    """One group's outputs: the fused chain, or, on one worker when every sample is known at
    trace time to hold one id (a RaggedTensor with uniform_row_length 1, as
    tf.RaggedTensor.from_tensor(ids[:, None]) gives), the rows straight from the tables;
    on the CPU, ids of unknown lengths get that choice at run time (_either_id_path_group;
    on a GPU the check would wait for the device every step); dynamic tables on one worker
    read their rows directly (no low-frequency filter: that draws in the owner's read of
    the fused chain). 16-bit static tables always take the fused chain."""
    if dtype != tf.float32:
        return _fused_group(lookups, dim, training=training, compress=compress, dtype=dtype)
    if _single_id_candidates(lookups, dynamic):
        if all(lookup.one_id for lookup in lookups):
            return _single_id_group(lookups, dim)
        if not _on_gpu(lookups):
            return _either_id_path_group(lookups, dim)
    if _pools_from_tables(lookups, dynamic):
        return _pool_from_tables(lookups, dim)
    if dynamic and communication.num_workers() == 1 and not low_frequency_filter:
        return _dynamic_direct_group(lookups, dim, training)
    return _fused_group(lookups, dim, dynamic, training, low_frequency_filter, compress)


def lookup_sparse(params, sp_ids, sp_weights=None, combiners=None, use_low_frequency_filter=False,
                  training=True, compress=False):
    """Pooled embedding lookups of several tables in one fused op chain.

    Args:
      params: list of tables (`sok.Variable`, `sok.DynamicVariable`; a plain `tf.Variable`
        is treated as replicated on every worker), static ones float32, float16 or bfloat16.
        Several lookups may share one table.
      sp_ids: list, one per lookup, of 2-D `tf.SparseTensor` or `tf.RaggedTensor` of int32 or
        int64 ids, [local_batch, None]; or, with a list of tables, one RaggedTensor holding
        every lookup's batch, feature-major ([lookups * local_batch, None]: lookup 0's samples,
        then lookup 1's, as TorchRec's KeyedJaggedTensor), which crosses into TensorFlow as two
        tensors, or that batch staged by `sok.stage_features` in the input pipeline; its
        output is then one [local_batch, lookups, dim] tensor. A SparseTensor's
        entries must be in row order (`tf.sparse.reorder` sorts them; on the CPU rows out of
        order are refused); its columns are not read, as in
        `tf.nn.safe_embedding_lookup_sparse`.
      sp_weights: None, or a list like sp_ids of per-id weights (entries may be None), float32
        or float16 / bfloat16 / float64 (pooled in float32); with packed ids, one RaggedTensor
        laid out as they are.
      combiners: list of "sum", "mean" (the default) or "sqrtn" (with packed ids, also one
        string for every lookup).
      use_low_frequency_filter: admit each new key of a dynamic table with probability
        `filter_ratio` (its config); a key not admitted reads as zeros and is not stored.
      training: with False (inference), ids missing from a dynamic table read as zeros and
        are not inserted; with True they are inserted with their initial value.
      compress: send the embedding vectors (and, backward, their gradients) between workers
        as float16, halving the all-to-all's bytes; pooling and updates stay float32.
        (Rows of 16-bit static tables always travel as stored.)

    Returns:
      A list with one [local_batch, dim] tensor per lookup, equal to
      `tf.nn.safe_embedding_lookup_sparse` on the whole table (empty samples give zeros):
      float32, or a float16 / bfloat16 static table's dtype (pooled in float32, rounded once).
      Gradients reach the tables as `tf.IndexedSlices` of their local shards.

    Raises:
      TypeError / ValueError before anything runs on bad lists, types, ranks or combiners;
      tf.errors.InvalidArgumentError when an id is outside its table or weights do not match.
    """
    single = not isinstance(params, (list, tuple))
    if not single and isinstance(sp_ids, (tf.RaggedTensor, staging.StagedFeatures)):
        return _lookup_packed(params, sp_ids, sp_weights, combiners, use_low_frequency_filter,
                              training, compress)
    if single:
        params, sp_ids = [params], [sp_ids]
        sp_weights = None if sp_weights is None else [sp_weights]
        combiners = None if combiners is None else [combiners]
    communication._require_init()
    lookups = _validate(params, sp_ids, sp_weights, combiners)
    outputs = [None] * len(lookups)
    with tf.name_scope("sok_lookup_sparse"):
        for (dim, dynamic, dtype), members in _group_tables(lookups).items():
            results = _lookup_group([lookups[i] for i in members], dim, dynamic, training,
                                    use_low_frequency_filter, compress, dtype)
            for i, result in zip(members, results):
                outputs[i] = result
    return outputs[0] if single else outputs


def _lookup_packed(params, packed_ids, packed_weights, combiners, use_low_frequency_filter,
                   training, compress):
    """lookup_sparse of a feature-major packed batch: one [batch, features, dim] output."""
    params = list(params)
    num_features = len(params)
    for i, param in enumerate(params):
        _check_table(param, i)
    kinds = {(int(p.shape[1]), _output_dtype(p)) for p in params}
    if len(kinds) != 1:
        raise ValueError("a packed batch's tables must share one dimension and output dtype "
                         "(its output is one [batch, features, dim] tensor); got (dim, dtype) "
                         f"{sorted((d, t.name) for d, t in kinds)}")
    if combiners is not None and not isinstance(combiners, (list, tuple)):
        combiners = [combiners] * num_features
    staged = isinstance(packed_ids, staging.StagedFeatures)
    if staged:
        ids = _unstage_features(packed_ids, params, packed_weights)
    else:
        ids = _unpack_features(packed_ids, num_features, params, "sp_ids")
    weights = None
    if packed_weights is not None:
        if not isinstance(packed_weights, tf.RaggedTensor):
            raise TypeError("sp_weights of a packed batch must be a RaggedTensor laid out as "
                            f"its ids, got {type(packed_weights).__name__}")
        weights = _unpack_features(packed_weights, num_features, params, "sp_weights",
                                   row_splits=[i.row_splits for i in ids])
    communication._require_init()
    lookups = _validate(params, ids, weights, combiners)
    if _pools_from_tables(lookups, any(isinstance(p, DynamicVariable) for p in params)):
        with tf.name_scope("sok_lookup_sparse"):  # the stacked output written by the kernel
            return _pool_from_tables(lookups, int(params[0].shape[1]), stacked=True,
                                     ids_checked=staged)[0]
    outputs = lookup_sparse(params, ids, weights, combiners, use_low_frequency_filter, training,
                            compress)
    return tf.stack(outputs, axis=1)


def _unpack_features(packed, num_features, tables, what, row_splits=None):
    """A feature-major packed RaggedTensor [features * batch, None] as one RaggedTensor a
    feature (Sok>UnpackFeatures, placed with the tables; the values are not copied where
    aligned). With row_splits (the ids'), only the values are taken from `packed`."""
    if packed.ragged_rank != 1 or packed.shape.rank != 2:
        raise ValueError(f"{what} of a packed batch must be a 2-D RaggedTensor "
                         f"[features * batch, None], got shape {packed.shape}")
    if what == "sp_ids":
        _check_id_dtype(packed.dtype, 0)
    elif packed.dtype not in _WEIGHT_DTYPES:
        raise TypeError(f"{what} has dtype {packed.dtype.name}; weights must be float32, "
                        "float16, bfloat16 or float64")
    rows = tf.compat.dimension_value(packed.shape[0])
    if rows is not None and rows % num_features != 0:
        raise ValueError(f"{what} holds {rows} rows, which do not split into {num_features} "
                         "features of one batch size each (feature-major: feature 0's samples, "
                         "then feature 1's)")
    on_gpu = any(_table_on_gpu(table) for table in tables)
    device = next(t.handle.device for t in tables if _table_on_gpu(t)) if on_gpu else "CPU:0"
    unpack = (raw_ops.sok_unpack_features_from_host
              if on_gpu and _in_host_memory(packed.values) else raw_ops.sok_unpack_features)
    with tf.device(device):
        values, splits = unpack(values=packed.values, row_splits=packed.row_splits,
                                num_features=num_features)
    if row_splits is not None:
        splits = row_splits
    return [tf.RaggedTensor.from_row_splits(v, r, validate=False) for v, r in zip(values, splits)]


def _unstage_features(staged, tables, weights):
    """A batch staged by `sok.stage_features` as one RaggedTensor a feature, on the tables'
    device; each static table's ids checked on the host (the plan carries each feature's id
    range), so no step waits for the device to check them."""
    if staged.num_features != len(tables):
        raise ValueError(f"the staged batch holds {staged.num_features} features but "
                         f"{len(tables)} tables were given")
    if weights is not None:
        raise ValueError("a staged batch takes no sp_weights; pass the packed RaggedTensor "
                         "to weight its ids")
    device = next((t.handle.device for t in tables if _table_on_gpu(t)), "CPU:0")
    id_limits = [-1 if isinstance(t, DynamicVariable) else _placement_attrs(t)[0]
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


# The most lookups of one call whose ids are checked on the host. The host pass over the ids
# lies on the step's path: for one table's batch (T3) it costs less than the wait for the
# GPU's verdict it saves; for 26 tables' (T1's list form) it cost more on an H100.
_HOST_CHECK_MAX_LOOKUPS = 4


def _ids_checked_on_host(lookups):
    """The lookups' ids checked against their static tables in host memory, on their way to
    the GPU (Sok>CheckIdsOnHost), where every lookup's ids come from an input pipeline and
    they are few; then no step waits for the GPU's own check. None otherwise."""
    if len(lookups) > _HOST_CHECK_MAX_LOOKUPS:
        return None
    if not all(_from_input_pipeline(lookup.ids) for lookup in lookups):
        return None
    dtypes = {lookup.ids.dtype for lookup in lookups}
    with tf.device("CPU:0"):  # ids of one dtype checked as they are: cast (if) on the device
        return raw_ops.sok_check_ids_on_host(
            ids=[lookup.ids if len(dtypes) == 1 else tf.cast(lookup.ids, tf.int64)
                 for lookup in lookups],
            rows=[_placement_attrs(lookup.table)[0] for lookup in lookups],
            table_names=[lookup.table.name for lookup in lookups])


tf.no_gradient("Sok>CheckIdsOnHost")
tf.no_gradient("Sok>PooledGradShares")
tf.no_gradient("Sok>UnpackFeatures")
tf.no_gradient("Sok>UnpackFeaturesFromHost")


def all2all_dense_embedding(param, indices):
    """Unpooled (sequence) lookup, like `tf.nn.embedding_lookup`: one vector per id.

    Args:
      param: a table (`sok.Variable`, `sok.DynamicVariable`, `tf.Variable`), or a list of them.
      indices: int32 / int64 ids of any shape, or a `tf.RaggedTensor` of ids; with a list of
        tables, a list of them, one per table. The lookups of a list share one fused op chain
        per group of tables of one dimension and kind, as in `lookup_sparse`.

    Returns:
      indices.shape + [dim] (a RaggedTensor of ids gives a RaggedTensor [..., None, dim] with
      its row partitions), or a list of them. Gradients reach the tables as
      `tf.IndexedSlices`, repeated ids summed by the update.
    """
    communication._require_init()
    single = not isinstance(param, (list, tuple))
    params = [param] if single else list(param)
    if single:
        indices = [indices]
    elif not isinstance(indices, (list, tuple)) or len(indices) != len(params):
        raise ValueError(f"indices must be a list with one entry per table ({len(params)}), "
                         f"got {type(indices).__name__}" +
                         (f" of {len(indices)}" if isinstance(indices, (list, tuple)) else ""))
    with tf.name_scope("sok_all2all_dense_embedding"):
        lookups = []
        for i, (table, ids) in enumerate(zip(params, indices)):
            _check_table(table, i)
            flat = (ids.flat_values if isinstance(ids, tf.RaggedTensor)
                    else tf.convert_to_tensor(ids))
            if flat.dtype not in staging.ID_DTYPES:
                raise TypeError(f"indices[{i}] have dtype {flat.dtype.name}; ids must be int32 "
                                "or int64")
            flat = tf.reshape(flat, [-1])
            lookups.append(_Lookup(table, flat, _one_id_row_splits(flat), None, "sum", True))
        rows = [None] * len(lookups)
        for (dim, dynamic, dtype), members in _group_tables(lookups).items():
            results = _lookup_group([lookups[i] for i in members], dim, dynamic, training=True,
                                    low_frequency_filter=False, compress=False, dtype=dtype)
            for i, result in zip(members, results):
                rows[i] = result
        outputs = [_shaped_like(ids, r, int(table.shape[1]))
                   for ids, r, table in zip(indices, rows, params)]
    return outputs[0] if single else outputs


def _one_id_row_splits(flat):
    """Row splits 0, 1, ..., n of n ids, one a sample (static length where n is known)."""
    count = tf.compat.dimension_value(flat.shape[0])
    if count is None:
        count = tf.size(flat, out_type=tf.int64)
    return tf.range(tf.cast(count, tf.int64) + 1, dtype=tf.int64)


def _shaped_like(ids, rows, dim):
    """rows ([n, dim], one per id of `ids` in order) shaped as ids + [dim]."""
    if isinstance(ids, tf.RaggedTensor):
        return ids.with_flat_values(rows)
    ids = tf.convert_to_tensor(ids)
    if ids.shape.rank == 1:
        return rows
    return tf.reshape(rows, tf.concat([tf.shape(ids), [dim]], 0))


def _table_counts_of(keys):
    """Sok>PartitionKeys' count of each table's keys where `keys` are its own send_keys (one
    worker; Sok>SplitGradientByTable then need not count them on the GPU, nor wait for that),
    else an empty tensor (unknown: counted)."""
    if (not tf.executing_eagerly() and keys.op.type == "Sok>PartitionKeys" and
            keys.value_index == 0):
        return keys.op.outputs[3]
    return tf.zeros([0], tf.int32)
