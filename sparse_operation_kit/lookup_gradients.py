"""Gradients of the lookup ops, registered with TensorFlow when the package is imported:
IndexedSlices of each table's rows, built from ids the forward checked (marked for the
optimizer through id_checks), or guarded on the device where nothing waited for the check.
"""
import weakref

import tensorflow as tf
from tensorflow.python.framework import ops

from sparse_operation_kit import id_checks
from sparse_operation_kit._ops import raw_ops
from sparse_operation_kit.lookup_paths import table_counts_of


def _table_gradients(op, indices, values):
    """One IndexedSlices per table handle among op's first inputs."""
    return [
        tf.IndexedSlices(values[t], id_checks.checked(indices[t]),
                         dense_shape=tf.raw_ops.VariableShape(input=op.inputs[t],
                                                              out_type=tf.int64))
        for t in range(len(indices))
    ]


def _dense_output_grads(op, output_grads):
    return [tf.zeros_like(op.outputs[i]) if g is None else tf.convert_to_tensor(g)
            for i, g in enumerate(output_grads)]


def _guards_ids_on_device(op):
    """Whether op's gradients guard their ids on the device instead of waiting for the id
    check: on a GPU, where that wait would leave the GPU idle every step."""
    return "GPU" in _placed_device(op.inputs[0]).upper()


def _placed_device(tensor):
    """The device of `tensor`, a table's handle; inside a tf.function the handle is a
    capture without a device of its own, so the captured outer handle's is taken."""
    while not tensor.device:
        captures = getattr(tensor.graph, "captures", ())
        outer = next((external for external, internal in captures if internal is tensor), None)
        if outer is None:
            return ""
        tensor = outer
    return tensor.device


def _host_verdict(op):
    """The Sok>CheckIdsOnHost ops that op's outputs wait for (lookup_inputs.after_verdict
    makes identities of them under control dependencies); none eagerly, where the check has
    run before the lookup."""
    if tf.executing_eagerly() or not hasattr(op, "outputs"):
        return []
    found = {}
    for output in op.outputs:
        for consumer in output.consumers():
            for control in consumer.control_inputs:
                if control.type == "Sok>CheckIdsOnHost":
                    found[control.name] = control
    return list(found.values())


def _after(verdict, grads, ids):
    """grads and ids as identities that wait for the verdict ops (pooled_gradient_shares
    reads such guards off the gradient's identities)."""
    with tf.control_dependencies(verdict):
        return [tf.identity(g) for g in grads], [tf.identity(i) for i in ids]


def _id_gradients(op, n, ids, grads, check):
    """IndexedSlices over each lookup's ids for tables op.inputs[:n], given the forward's id
    check record. No update may use a step whose ids were out of range."""
    if op.get_attr("host_checked"):
        # Checked on the host: before the forward ran (a staged batch: nothing to wait for),
        # or beside it, where the gradients wait for the verdict as the forward's outputs do
        # (an output no loss reads leaves a zero gradient that would not).
        verdict = _host_verdict(op)
        if verdict:
            grads, ids = _after(verdict, grads, ids)
        ids = [id_checks.checked(i) for i in ids]
    elif _guards_ids_on_device(op) or id_checks.mode() == "deferred":
        # The forward's Sok>CheckGatheredIds reports the error; here, on the device, every
        # gradient id of such a step becomes -1 (Sok>GuardIds, one op for all lookups), a
        # row that every sparse update skips (Sok>StaticApply, TF's GPU scatters) or refuses
        # before writing.
        ids = [id_checks.checked(i) for i in raw_ops.sok_guard_ids(ids=ids, check=check)]
    else:  # the gradients wait for the check
        verdict = raw_ops.sok_check_gathered_ids(check, table_names=op.get_attr("table_names"))
        grads, ids = _after([] if verdict is None else [verdict], grads, ids)
        ids = [id_checks.checked(i) for i in ids]
    return [
        tf.IndexedSlices(grads[l], ids[l],
                         dense_shape=tf.raw_ops.VariableShape(input=op.inputs[l],
                                                              out_type=tf.int64))
        for l in range(n)
    ]


@tf.RegisterGradient("Sok>GatherSingleIds")
def _gather_single_ids_grad(op, *output_grads):
    n = op.get_attr("N")
    grads = _dense_output_grads(op, output_grads)[:n]
    ids = [tf.cast(op.inputs[n + l], tf.int64) for l in range(n)]
    return _id_gradients(op, n, ids, grads, op.outputs[n]) + [None] * n


@tf.RegisterGradient("Sok>PoolFromTables")
def _pool_from_tables_grad(op, *output_grads):
    n, num_outputs = op.get_attr("N"), op.get_attr("num_outputs")
    ids = list(op.inputs[n:2 * n])
    id_grads = raw_ops.sok_spread_pooled_grad(
        output_grads=_dense_output_grads(op, output_grads)[:num_outputs], ids=ids,
        row_splits=list(op.inputs[2 * n:3 * n]), weights=list(op.inputs[3 * n:4 * n]),
        stacked=op.get_attr("stacked"), combiners=op.get_attr("combiners"),
        dim=op.get_attr("dim"))
    return _id_gradients(op, n, ids, id_grads, op.outputs[num_outputs]) + [None] * (3 * n)


# The Sok>PooledGradShares op made for each Sok>SpreadPooledGrad op, by graph and name (names
# only: a tensor would keep its graph, and the variables it captured, alive).
_POOLED_SHARES = weakref.WeakKeyDictionary()


def pooled_gradient_shares(values):
    """For an update that reads a pooled lookup's output gradient in place: when `values` are
    one lookup's rows of Sok>SpreadPooledGrad (the gradient as lookup_sparse's pooling straight
    from the tables left it, in a graph), (the output gradient as a [rows, dim] matrix, each
    id's row of it, each id's scale) from Sok>PooledGradShares, one op for all the lookups;
    else None. Once no update reads them, the per-id rows are never computed."""
    if isinstance(values, ops.EagerTensor):
        return None
    op, guards = values.op, []
    if op.type == "Identity" and op.inputs[0].op.type == "Sok>SpreadPooledGrad":
        values, guards = op.inputs[0], op.control_inputs  # the host's id-check verdict
        op = values.op
    if op.type != "Sok>SpreadPooledGrad":
        return None
    n, num_outputs, dim = op.get_attr("N"), op.get_attr("num_outputs"), op.get_attr("dim")
    names = _POOLED_SHARES.setdefault(op.graph, {})
    if op.name not in names:
        with tf.device(op.device), tf.name_scope("sok_pooled_grad_shares"):
            shares = raw_ops.sok_pooled_grad_shares(
                ids=list(op.inputs[num_outputs:num_outputs + n]),
                row_splits=list(op.inputs[num_outputs + n:num_outputs + 2 * n]),
                weights=list(op.inputs[num_outputs + 2 * n:num_outputs + 3 * n]),
                num_outputs=num_outputs, stacked=op.get_attr("stacked"),
                combiners=op.get_attr("combiners"), dim=dim)
        names[op.name] = shares[0][0].op.name
    outputs = op.graph.get_operation_by_name(names[op.name]).outputs
    rows, scales = outputs[:n], outputs[n:]
    l = values.value_index
    source = op.inputs[0 if op.get_attr("stacked") else l]
    with tf.control_dependencies(guards):  # read after the verdict, as the rows were
        return tf.reshape(source, [-1, dim]), tf.identity(rows[l]), scales[l]


@tf.RegisterGradient("Sok>GatherShardRows")
def _gather_shard_rows_grad(op, grad):
    """The rows' gradients by table, in the tables' dtype (16-bit tables: split as float32,
    each row rounded once)."""
    num_tables, dtype = op.get_attr("num_tables"), op.get_attr("dtype")
    keys = op.inputs[num_tables]
    indices, values = raw_ops.sok_split_gradient_by_table(
        keys=keys, grad=tf.cast(grad, tf.float32), table_counts=table_counts_of(keys),
        num_tables=num_tables)
    values = [tf.cast(v, dtype) for v in values]
    return _table_gradients(op, indices, values) + [None]


@tf.RegisterGradient("Sok>DynamicTableLookup")
def _dynamic_table_lookup_grad(op, grad):
    return [tf.IndexedSlices(tf.convert_to_tensor(grad), op.inputs[1]), None]


@tf.RegisterGradient("Sok>DynamicGatherRows")
def _dynamic_gather_rows_grad(op, grad):
    num_tables = op.get_attr("num_tables")
    indices, values = raw_ops.sok_split_dynamic_gradient(
        keys=op.inputs[num_tables], grad=tf.convert_to_tensor(grad), num_tables=num_tables)
    return [tf.IndexedSlices(v, i) for i, v in zip(indices, values)] + [None]


@tf.RegisterGradient("Sok>CombineFromShards")
def _combine_from_shards_grad(op, *output_grads):
    num_tables, n = op.get_attr("num_tables"), op.get_attr("N")
    keys, position = op.inputs[num_tables], op.inputs[num_tables + 1]
    row_splits = list(op.inputs[num_tables + 2:num_tables + 2 + n])
    weights = list(op.inputs[num_tables + 2 + n:num_tables + 2 + 2 * n])
    rows_grad = raw_ops.sok_combine_backward(
        output_grads=_dense_output_grads(op, output_grads), position=position,
        row_splits=row_splits, weights=weights, num_rows=tf.size(keys, out_type=tf.int64),
        combiners=op.get_attr("combiners"), validate=op.get_attr("validate"))
    indices, values = raw_ops.sok_split_gradient_by_table(
        keys=keys, grad=rows_grad, table_counts=table_counts_of(keys), num_tables=num_tables)
    return _table_gradients(op, indices, values) + [None] * (2 + 2 * n)


@tf.RegisterGradient("Sok>CombineForward")
def _combine_forward_grad(op, *output_grads):
    n = op.get_attr("N")
    rows, position = op.inputs[0], op.inputs[1]
    row_splits = list(op.inputs[2:2 + n])
    weights = list(op.inputs[2 + n:2 + 2 * n])
    rows_grad = raw_ops.sok_combine_backward(
        output_grads=_dense_output_grads(op, output_grads), position=position, row_splits=row_splits, weights=weights,
        num_rows=tf.shape(rows, out_type=tf.int64)[0], combiners=op.get_attr("combiners"),
        validate=op.get_attr("validate"))
    return [rows_grad, None] + [None] * (2 * n)


tf.no_gradient("Sok>CheckIdsOnHost")
tf.no_gradient("Sok>ElideOneIdRowSplits")
tf.no_gradient("Sok>PooledGradShares")
tf.no_gradient("Sok>UnpackFeatures")
tf.no_gradient("Sok>UnpackFeaturesFromHost")
