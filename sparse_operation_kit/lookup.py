"""The fused, distributed embedding lookup: `lookup_sparse` and `all2all_dense_embedding`.

A call reads top to bottom: the input stage checks and flattens the tables, ids and weights
(lookup_inputs.py); the lookups are grouped by table dimension and kind, and each group takes
one path (_lookup_group chooses; the paths and their stages are in lookup_paths.py); the
gradients are registered in lookup_gradients.py.
"""
import collections

import tensorflow as tf

from sparse_operation_kit import communication, lookup_inputs, staging
from sparse_operation_kit.dynamic_variable import DynamicVariable
from sparse_operation_kit.lookup_inputs import (Lookup, check_table, unpack_features,
                                                unstage_features, validate_lookups)
from sparse_operation_kit.lookup_paths import (dynamic_direct_path, either_id_path, fused_chain,
                                               pool_from_tables_path, row_positions,
                                               single_id_path, with_static_batch)

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


def _single_id_candidates(lookups, dynamic):
    """Whether a group may skip dedup and exchange when each sample holds one id: one worker,
    static tables, no weights (one unweighted row pools to itself under every combiner)."""
    return (not dynamic and communication.num_workers() == 1 and
            all(lookup.weights is None for lookup in lookups))


def _pools_from_tables(lookups, dynamic):
    """Whether a group pools straight from its tables: one worker, static float32 tables,
    all on a GPU, where the fused chain's dedup would wait for the device every step."""
    return (not dynamic and communication.num_workers() == 1 and
            all(lookup_inputs.table_on_gpu(lookup.table) and lookup.table.dtype == tf.float32
                for lookup in lookups))


def _on_gpu(lookups):
    return any(lookup_inputs.table_on_gpu(lookup.table) for lookup in lookups)


def _lookup_group(lookups, dim, dynamic, training, low_frequency_filter, compress,
                  dtype=tf.float32, ids_checked=False):
    """One group's outputs ([batch, dim] each), their batch size static where the row splits'
    length is."""
    outputs = _lookup_group_path(lookups, dim, dynamic, training, low_frequency_filter,
                                 compress, dtype, ids_checked)
    return with_static_batch(outputs, lookups)


def _lookup_group_path(lookups, dim, dynamic, training, low_frequency_filter, compress,
                       dtype=tf.float32, ids_checked=False):
    """One group's outputs: the fused chain, or, on one worker when every sample is known at
    trace time to hold one id (a RaggedTensor with uniform_row_length 1, as
    tf.RaggedTensor.from_tensor(ids[:, None]) gives), the rows straight from the tables;
    on the CPU, ids of unknown lengths get that choice at run time (either_id_path;
    on a GPU the check would wait for the device every step); dynamic tables on one worker
    read their rows directly (no low-frequency filter: that draws in the owner's read of
    the fused chain). 16-bit static tables always take the fused chain. ids_checked: the
    static tables' ids were checked on the host already (a staged batch's), so the one-id
    and pooled-from-tables paths do not wait for the device's check."""
    if dtype != tf.float32:
        return fused_chain(lookups, dim, training=training, compress=compress, dtype=dtype)
    if _single_id_candidates(lookups, dynamic):
        if all(lookup.one_id for lookup in lookups):
            return single_id_path(lookups, dim, ids_checked=ids_checked)
        if not _on_gpu(lookups):
            return either_id_path(lookups, dim)
    if _pools_from_tables(lookups, dynamic):
        return pool_from_tables_path(lookups, dim, ids_checked=ids_checked)
    if dynamic and communication.num_workers() == 1 and not low_frequency_filter:
        return dynamic_direct_path(lookups, dim, training)
    return fused_chain(lookups, dim, dynamic, training, low_frequency_filter, compress)


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
    lookups = validate_lookups(params, sp_ids, sp_weights, combiners)
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
        check_table(param, i)
    kinds = {(int(p.shape[1]), _output_dtype(p)) for p in params}
    if len(kinds) != 1:
        raise ValueError("a packed batch's tables must share one dimension and output dtype "
                         "(its output is one [batch, features, dim] tensor); got (dim, dtype) "
                         f"{sorted((d, t.name) for d, t in kinds)}")
    if combiners is not None and not isinstance(combiners, (list, tuple)):
        combiners = [combiners] * num_features
    staged = isinstance(packed_ids, staging.StagedFeatures)
    if staged:
        ids = unstage_features(packed_ids, params, packed_weights)
    else:
        ids = unpack_features(packed_ids, num_features, params, "sp_ids")
    weights = None
    if packed_weights is not None:
        if not isinstance(packed_weights, tf.RaggedTensor):
            raise TypeError("sp_weights of a packed batch must be a RaggedTensor laid out as "
                            f"its ids, got {type(packed_weights).__name__}")
        weights = unpack_features(packed_weights, num_features, params, "sp_weights",
                                   row_splits=[i.row_splits for i in ids])
    communication._require_init()
    lookups = validate_lookups(params, ids, weights, combiners)
    if _pools_from_tables(lookups, any(isinstance(p, DynamicVariable) for p in params)):
        with tf.name_scope("sok_lookup_sparse"):  # the stacked output written by the kernel
            return pool_from_tables_path(lookups, int(params[0].shape[1]), stacked=True,
                                     ids_checked=staged)[0]
    outputs = lookup_sparse(params, ids, weights, combiners, use_low_frequency_filter, training,
                            compress)
    return tf.stack(outputs, axis=1)


def all2all_dense_embedding(param, indices):
    """Unpooled (sequence) lookup, like `tf.nn.embedding_lookup`: one vector per id.

    Args:
      param: a table (`sok.Variable`, `sok.DynamicVariable`, `tf.Variable`), or a list of them.
      indices: int32 / int64 ids of any shape, or a `tf.RaggedTensor` of ids; with a list of
        tables, a list of them, one per table. The lookups of a list share one fused op chain
        per group of tables of one dimension and kind, as in `lookup_sparse`. With a list of
        tables, also one feature-major RaggedTensor [tables * batch, None] holding every
        table's batch (as `lookup_sparse` takes it), or that batch staged by
        `sok.stage_features` in the input pipeline (its ids then cross to the GPU in one copy
        from pinned memory and are checked on the host, so no step waits for the device).

    Returns:
      indices.shape + [dim] (a RaggedTensor of ids gives a RaggedTensor [..., None, dim] with
      its row partitions), or a list of them; for a packed or staged batch, one RaggedTensor
      [batch, None, dim] a table. Gradients reach the tables as `tf.IndexedSlices`, repeated
      ids summed by the update.
    """
    single = not isinstance(param, (list, tuple))
    if not single and isinstance(indices, (tf.RaggedTensor, staging.StagedFeatures)):
        return _dense_embedding_packed(list(param), indices)
    communication._require_init()
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
            check_table(table, i)
            flat = (ids.flat_values if isinstance(ids, tf.RaggedTensor)
                    else tf.convert_to_tensor(ids))
            if flat.dtype not in staging.ID_DTYPES:
                raise TypeError(f"indices[{i}] have dtype {flat.dtype.name}; ids must be int32 "
                                "or int64")
            flat = tf.reshape(flat, [-1])
            lookups.append(Lookup(table, flat, _one_id_row_splits(flat), None, "sum", True))
        rows = _rows_of_ids(lookups)
        outputs = [_shaped_like(ids, r, int(table.shape[1]))
                   for ids, r, table in zip(indices, rows, params)]
    return outputs[0] if single else outputs


def _dense_embedding_packed(params, packed):
    """all2all_dense_embedding of a feature-major packed batch (a RaggedTensor
    [features * batch, None] or that batch staged by `sok.stage_features`): one RaggedTensor
    [batch, None, dim] a feature, its rows in the order of its ids, as TorchRec's sequence
    embeddings give one jagged tensor a feature. A staged batch's ids were checked on the
    host, so no step waits for the device to check them."""
    for i, param in enumerate(params):
        check_table(param, i)
    staged = isinstance(packed, staging.StagedFeatures)
    if staged:
        features = unstage_features(packed, params, None)
    else:
        features = unpack_features(packed, len(params), params, "indices")
    communication._require_init()
    with tf.name_scope("sok_all2all_dense_embedding"):
        lookups = [Lookup(table, ids.values, _one_id_row_splits(ids.values), None, "sum", True)
                   for table, ids in zip(params, features)]
        rows = _rows_of_ids(lookups, ids_checked=staged)
        return [ids.with_flat_values(r) for ids, r in zip(features, rows)]


def _rows_of_ids(lookups, ids_checked=False):
    """Each one-id-a-sample lookup's rows ([ids, dim]), one op chain per group of tables."""
    rows = [None] * len(lookups)
    for (dim, dynamic, dtype), members in _group_tables(lookups).items():
        results = _lookup_group([lookups[i] for i in members], dim, dynamic, training=True,
                                low_frequency_filter=False, compress=False, dtype=dtype,
                                ids_checked=ids_checked)
        for i, result in zip(members, results):
            rows[i] = result
    return rows


def _one_id_row_splits(flat):
    """Row splits 0, 1, ..., n of n ids, one a sample (nothing waits for the device)."""
    return row_positions(flat, extra=1)


def _shaped_like(ids, rows, dim):
    """rows ([n, dim], one per id of `ids` in order) shaped as ids + [dim]."""
    if isinstance(ids, tf.RaggedTensor):
        return ids.with_flat_values(rows)
    ids = tf.convert_to_tensor(ids)
    if ids.shape.rank == 1:
        return rows
    return tf.reshape(rows, tf.concat([tf.shape(ids), [dim]], 0))
