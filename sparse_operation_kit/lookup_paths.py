"""The lookup paths, each a named unit over one group of lookups (tables of one dimension and
kind) that returns one output a lookup; lookup.py chooses among them.

fused_chain, the general path, in the stages TorchRec names:
  input distribution   Sok>PartitionKeys: dedup per table, route each key to its owner;
                       all-to-all of the packed keys
  local lookup         the owner reads the rows: Sok>GatherShardRows from its local shards,
                       Sok>DynamicGatherRows from its hash tables
  output distribution  all-to-all of the rows back to the workers that asked
  combine              Sok>CombineForward: pool each sample's rows with its combiner
With one worker the exchanges are skipped and static float32 tables pool straight from the
shards (Sok>CombineFromShards). Static tables deduplicate through a bitmap, so each table's
keys are sorted and the gather reads the shard in increasing row order. Backward is autodiff
of the same chain (lookup_gradients.py).

The one-worker shortcuts: single_id_path (every sample holds one id, known at trace time:
Sok>GatherSingleIds, rows straight from the tables, no dedup); either_id_path (that choice
made per step on the CPU); pool_from_tables_path (static float32 tables on a GPU:
Sok>PoolFromTables pools from the tables with no dedup, sort or host wait); dynamic_direct_path
(dynamic tables read by find-or-insert, then pooled).
"""
import tensorflow as tf
from tensorflow.python.eager import record
from tensorflow.python.ops import resource_variable_ops

from sparse_operation_kit import communication, id_checks
from sparse_operation_kit._ops import raw_ops
from sparse_operation_kit.lookup_inputs import after_verdict, host_verdict, placement_attrs
from sparse_operation_kit.placement import DISTRIBUTED

def _unique_tables(lookups):
    """(the lookups' tables, each once, in first-seen order; each lookup's index among them)."""
    index = {}
    for lookup in lookups:
        index.setdefault(id(lookup.table), (len(index), lookup.table))
    tables = [table for _, table in index.values()]
    return tables, [index[id(lookup.table)][0] for lookup in lookups]


def partition_keys(ids, lookup_table, tables, dynamic):
    """Sok>PartitionKeys over the group's tables: (send keys, splits, position)."""
    placements = [placement_attrs(table) for table in tables]
    return raw_ops.sok_partition_keys(
        ids=ids, lookup_table=lookup_table, table_rows=[rows for rows, _ in placements],
        table_owner=[owner if owner != DISTRIBUTED else -1 for _, owner in placements],
        table_names=[table.name for table in tables], num_workers=communication.num_workers(),
        table_dynamic=[dynamic] * len(tables), pair_keys=dynamic)


def fused_chain(lookups, dim, dynamic=False, training=True, low_frequency_filter=False,
                compress=False, dtype=tf.float32):
    """Runs the op chain for lookups whose tables share `dim` (and, static, `dtype`); returns
    one output each. 16-bit static tables: their rows are gathered and exchanged as they are
    stored, pooled in float32, and the outputs rounded to `dtype` once."""
    tables, lookup_table = _unique_tables(lookups)
    for table in tables:  # so GradientTape and tf.function see the tables being read
        resource_variable_ops.variable_accessed(table)
    # int64 ids: TensorFlow keeps int32 tensors of GPU kernels in host memory.
    ids = [tf.cast(lookup.ids, tf.int64) for lookup in lookups]
    send_keys, splits, position, _ = partition_keys(ids, lookup_table, tables, dynamic)
    if not dynamic and dtype == tf.float32 and communication.num_workers() == 1:
        # Nothing to exchange: pool each sample's rows straight from the shards.
        return _combine(lookups, raw_ops.sok_combine_from_shards, position,
                        shards=[table.handle for table in tables], keys=send_keys,
                        dtype=tf.float32, dim=dim)
    received_keys, received_splits = input_distribution(send_keys, splits)
    rows = local_lookup(tables, received_keys, dim, dynamic, training, low_frequency_filter,
                        dtype)
    rows = output_distribution(rows, received_splits, splits, compress, dtype)
    outputs = _combine(lookups, raw_ops.sok_combine_forward, position, rows=rows)
    return outputs if dtype == tf.float32 else [tf.cast(output, dtype) for output in outputs]


def input_distribution(send_keys, splits):
    """The partitioned keys to their owners (all-to-all): (the keys this worker owns, how many
    came from each worker)."""
    return communication.alltoall(send_keys, splits)


def local_lookup(tables, keys, dim, dynamic, training, low_frequency_filter, dtype):
    """The owner's rows of the keys it received: from its shards of static tables (as stored),
    or found (and, training, inserted) in its hash tables."""
    if dynamic:
        admit = [table.filter_ratio if low_frequency_filter else 1.0 for table in tables]
        return raw_ops.sok_dynamic_gather_rows(
            tables=[table.handle for table in tables], keys=keys, dim=dim, insert=training,
            admit_probability=admit, validate=False)
    return raw_ops.sok_gather_shard_rows(shards=[table.handle for table in tables], keys=keys,
                                         dtype=dtype, dim=dim)


def output_distribution(rows, received_splits, splits, compress, dtype):
    """The rows back along the keys' routes (each worker knows what it receives), as float32;
    16-bit rows travel as stored, and with compress float32 rows (and their gradients) travel
    as float16."""
    if dtype != tf.float32:
        return tf.cast(communication.alltoall_known(rows, received_splits, splits), tf.float32)
    if compress and communication.num_workers() > 1:
        rows = communication.alltoall_known(tf.cast(rows, tf.float16), received_splits, splits)
        return tf.cast(rows, tf.float32)
    return communication.alltoall_known(rows, received_splits, splits)


def _combine(lookups, combine_op, position, **source):
    """Each sample's rows at its positions, pooled by its lookup's combiner and weights.
    Positions and keys come from Sok>PartitionKeys, row_splits from RaggedTensors: only user
    weights still need the combine ops' checks (see Sok>CombineForward's validate)."""
    empty = tf.zeros([0], tf.float32)
    return combine_op(
        position=position, row_splits=[lookup.row_splits for lookup in lookups],
        weights=[empty if lookup.weights is None else lookup.weights for lookup in lookups],
        combiners=[lookup.combiner for lookup in lookups],
        validate=any(lookup.weights is not None for lookup in lookups), **source)


def single_id_path(lookups, dim, ids_checked=False):
    """Sok>GatherSingleIds: each output is its table's rows at the ids; gradients are the
    outputs' gradients as IndexedSlices over the ids, as for tf.gather. With ids checked on
    the host (a staged batch's, or any from an input pipeline: host_verdict), the device
    checks nothing, as in pool_from_tables_path."""
    tables = [lookup.table for lookup in lookups]
    for table in {id(t): t for t in tables}.values():
        resource_variable_ops.variable_accessed(table)
    verdict = None if ids_checked else host_verdict(lookups)[0]
    ids_checked = ids_checked or verdict is not None
    names = [t.name for t in tables]
    outputs, check = raw_ops.sok_gather_single_ids(
        tables=[t.handle for t in tables],
        ids=[tf.cast(lookup.ids, tf.int64) for lookup in lookups],  # int64: as fused_chain
        dtype=tf.float32, dim=dim, table_names=names, host_checked=ids_checked)
    if verdict is not None:
        return after_verdict(verdict, outputs)
    if not ids_checked:
        # Reports an out-of-range id (stateful: it runs in a tf.function even though nothing
        # reads it); on the GPU the gather itself does not wait for that verdict.
        raw_ops.sok_check_gathered_ids(check, table_names=names,
                                       deferred=id_checks.mode() == "deferred")
    return outputs


def pool_from_tables_path(lookups, dim, stacked=False, ids_checked=False):
    """Sok>PoolFromTables: each sample's weighted rows pooled straight from its table, with no
    dedup, sort or exchange, so nothing waits for the device; the gradients are IndexedSlices
    over the ids (Sok>SpreadPooledGrad), repeats summed by the update. With stacked, one
    [batch, lookups, dim] output for all the lookups. With ids and row splits checked on the
    host (a staged batch's, or any from an input pipeline: host_verdict), the device checks
    nothing: the step neither waits for a device check nor runs one, and row splits in which every
sample holds one id are elided (Sok>ElideOneIdRowSplits), so they never cross to the GPU."""
    tables = [lookup.table for lookup in lookups]
    for table in {id(t): t for t in tables}.values():
        resource_variable_ops.variable_accessed(table)
    names = [t.name for t in tables]
    empty = tf.zeros([0], tf.float32)
    verdict, splits_checked = (None, False) if ids_checked else host_verdict(
        lookups, with_row_splits=True)
    ids_checked = ids_checked or splits_checked  # the ids and row splits
    row_splits = [lookup.row_splits for lookup in lookups]
    if splits_checked:  # in host memory: where each sample holds one id, none cross
        with tf.device("CPU:0"):
            row_splits = raw_ops.sok_elide_one_id_row_splits(
                row_splits=row_splits, ids=[lookup.ids for lookup in lookups])
    outputs, check = raw_ops.sok_pool_from_tables(
        tables=[t.handle for t in tables],
        ids=[tf.cast(lookup.ids, tf.int64) for lookup in lookups],
        row_splits=row_splits,
        weights=[empty if lookup.weights is None else lookup.weights for lookup in lookups],
        num_outputs=1 if stacked else len(lookups), stacked=stacked,
        combiners=[lookup.combiner for lookup in lookups], dim=dim, table_names=names,
        host_checked=ids_checked)
    if not ids_checked:  # the row splits still to check, or the ids too
        raw_ops.sok_check_gathered_ids(check, table_names=names,
                                       deferred=verdict is not None or
                                       id_checks.mode() == "deferred")
    outputs = with_static_batch(list(outputs), lookups)
    return after_verdict(verdict, outputs) if verdict is not None else outputs


def with_static_batch(outputs, lookups):
    """outputs, each with the static batch size of its lookup's row splits (a stacked output:
    the first lookup's) where the ops leave it unknown (Sok>GatherSingleIds sizes its output
    by the ids, Sok>PoolFromTables by row splits that may be elided, a tf.cond merges two
    branches' shapes). Without it the gradient of a sum of an output tiles the upstream
    gradient at run time rather than as a constant Grappler folds (26 x 4 MB a step in C1)."""
    for output, lookup in zip(outputs, lookups):
        splits = tf.compat.dimension_value(lookup.row_splits.shape[0])
        if splits is not None:
            output.set_shape([splits - 1] + [None] * (output.shape.rank - 1))
    return outputs


def dynamic_direct_path(lookups, dim, training):
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
    all_rows = _concat(rows)
    position = row_positions(all_rows, dtype=tf.uint32)
    return _combine(lookups, raw_ops.sok_combine_forward, position, rows=all_rows)


def row_positions(tensor, extra=0, dtype=tf.int64):
    """0, 1, ..., rows + extra - 1 over `tensor`'s rows, made on the tensor's device from its
    shape: a constant where the size is static, else the shape (host memory on a GPU too).
    The Range's start, limit and delta are made on the CPU, so a GPU's Range reads them
    without waiting for the device (int64 arithmetic or constants placed on a GPU would be
    read back; an int32 range is made on the host and copied over)."""
    rows = tf.compat.dimension_value(tensor.shape[0])
    shape = tf.shape(tensor, out_type=tf.int64) if rows is None else None
    with tf.device("CPU:0"):
        limit = tf.convert_to_tensor((shape[0] if rows is None else rows) + extra, tf.int64)
        start, delta = tf.constant(0, tf.int64), tf.constant(1, tf.int64)
    return tf.cast(tf.range(start, limit, delta), dtype)


def _one_id_at_run_time(lookups):
    """A scalar bool tensor: every sample of every lookup holds exactly one id (row_splits
    is 0, 1, 2, ...). One op over the row splits, no pass over the ids."""
    return raw_ops.sok_every_sample_holds_one_id(
        row_splits=[lookup.row_splits for lookup in lookups])


def either_id_path(lookups, dim):
    """One worker, static tables, no weights, ids of unknown lengths (RaggedTensors from
    row lengths, SparseTensors): when every sample turns out to hold one id, the rows come
    straight from the tables as in single_id_path, and the gradients are the outputs' own
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
                tables=[handles[t] for t in lookup_table], ids=ids, dtype=tf.float32,
                dim=dim, table_names=[names[t] for t in lookup_table])
            checked = raw_ops.sok_check_gathered_ids(
                check, table_names=[names[t] for t in lookup_table])
            with tf.control_dependencies([] if checked is None else [checked]):
                return list(outputs), empty_keys, empty_position, tf.constant(True)

        def rows_of_fused_chain():
            keys, _, position, _ = partition_keys(ids, lookup_table, tables, dynamic=False)
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
                    keys=keys, grad=rows_grad, table_counts=table_counts_of(keys),
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


def table_counts_of(keys):
    """Sok>PartitionKeys' count of each table's keys where `keys` are its own send_keys (one
    worker; Sok>SplitGradientByTable then need not count them on the GPU, nor wait for that),
    else an empty tensor (unknown: counted)."""
    if (not tf.executing_eagerly() and keys.op.type == "Sok>PartitionKeys" and
            keys.value_index == 0):
        return keys.op.outputs[3]
    return tf.zeros([0], tf.int32)
