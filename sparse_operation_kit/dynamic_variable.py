"""Hash-backed dynamic embedding tables that grow as new ids appear.

A `DynamicVariable` is a [None, dimension] table keyed by any int64 (or int32) id. It holds
the keys this worker owns: key k lives on worker uint64(k) % N ("distributed") or on worker
K ("localized:K"). As in SOK it is a TensorFlow resource variable whose handle is the hash
table: Keras tracks it (`model.trainable_variables`), `tf.nn.embedding_lookup(v, ids)` and
`tf.gather(v, ids)` read rows (inserting missing ids), and `tf.GradientTape` gives
`tf.IndexedSlices` keyed by id, which `sok.OptimizerWrapper` applies. It has no dense value:
`tf.convert_to_tensor(v)` is an error that says so.
`tf.train.Checkpoint` saves and restores the keys a worker holds with their rows and
optimizer state (restores replace the whole table).
"""
import datetime
import itertools
import json
import warnings
import zlib

import numpy as np
import tensorflow as tf
from google.protobuf import wrappers_pb2
from tensorflow.python.ops import resource_variable_ops
from tensorflow.python.saved_model import registration

from sparse_operation_kit import communication
from sparse_operation_kit._ops import raw_ops
from sparse_operation_kit.placement import parse_mode
from sparse_operation_kit.variables import PlacedTable, Variable

EVICT_STRATEGIES = ("lru", "lfu")
# SOK's (HierarchicalKV's) names for them; kCustomized takes user scores, which sok's API has
# no place for: it evicts by LRU, with a warning.
_EVICT_NAMES = {"lru": "lru", "lfu": "lfu", "klru": "lru", "klfu": "lfu",
                "kcustomized": "lru", "customized": "lru"}
# SOK's defaults for its hybrid tables: 64Mi keys a worker, then LRU eviction.
DEFAULT_MAX_CAPACITY = 64 * 1024 * 1024
DEFAULT_EVICT = "lru"
# HierarchicalKV options SOK accepts that do not apply to this table (its slot array and row
# pool size and place themselves): accepted, with a warning.
_HINT_CONFIG = ("max_load_factor", "max_bucket_size", "block_size",
                "device_id", "io_by_cpu", "use_constant_memory", "reserved_key_start_bit",
                "num_of_buckets_per_alloc", "dim")
# The HBM budget of a tiered ("hybrid") table: SOK's option in GB (2^30 bytes, its unit and
# default), or this project's in bytes.
_BUDGET_CONFIG = ("max_hbm_for_vectors", "hbm_budget_bytes")
DEFAULT_MAX_HBM_GB = 16
VALID_CONFIG = (("init_capacity", "max_capacity", "evict_strategy", "filter_ratio")
                + _BUDGET_CONFIG + _HINT_CONFIG)
# Tests set this to build tiered tables on the CPU too (both tiers then in host memory), so
# the tier logic is checked where no GPU is.
_TIER_ON_HOST = False


def _evict_strategy(config):
    """'lru', 'lfu' or None (a full table refuses new keys), from SOK's or sok's names."""
    evict = config.get("evict_strategy", DEFAULT_EVICT)
    if evict is None:
        return None
    name = getattr(evict, "name", evict)  # an enum member such as SOK's EvictStrategy.kLru
    strategy = _EVICT_NAMES.get(str(name).split(".")[-1].lower())
    if strategy is None:
        raise ValueError(f"unknown evict_strategy {evict!r}; valid strategies are "
                         "'lru' / 'kLru', 'lfu' / 'kLfu', 'kCustomized' (as LRU), or None to "
                         "fail when full")
    if str(name).lower().endswith("customized"):
        warnings.warn("evict_strategy kCustomized: sok keeps no user scores; evicting by LRU")
    return strategy
_VAR_TYPES = (None, "hbm", "hybrid")


def _hbm_budget_bytes(var_type, config):
    """The tiered table's HBM budget in bytes, or 0 for a table wholly in GPU memory."""
    given = [name for name in _BUDGET_CONFIG if name in config]
    if len(given) > 1:
        raise ValueError("give the HBM budget once: max_hbm_for_vectors (GB) or "
                         "hbm_budget_bytes (bytes), not both")
    for name in given:
        value = config[name]
        if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
            raise TypeError(f"{name} must be a number, got {value!r}")
        if not np.isfinite(value) or value <= 0:
            raise ValueError(f"{name} must be positive, got {value!r}")
    if var_type == "hbm" and given:
        raise ValueError(f"var_type='hbm' keeps the whole table in GPU memory; {given[0]} "
                         "applies to var_type='hybrid'")
    if "hbm_budget_bytes" in config:
        return int(config["hbm_budget_bytes"])
    if var_type != "hybrid":
        if given:
            warnings.warn("max_hbm_for_vectors applies to var_type='hybrid' tables; ignored")
        return 0
    return int(float(config.get("max_hbm_for_vectors", DEFAULT_MAX_HBM_GB)) * (1 << 30))
_counter = itertools.count()


def _parse_initializer(initializer):
    """(kind, a, b) of the table's row initializer."""
    if initializer is None or initializer in ("random", "normal", "random_normal"):
        return "normal", 0.0, 0.05
    if initializer == "uniform":
        return "uniform", -0.05, 0.05
    if initializer == "zeros":
        return "constant", 0.0, 0.0
    if initializer == "ones":
        return "constant", 1.0, 0.0
    if isinstance(initializer, str):
        try:
            return "constant", float(initializer), 0.0
        except ValueError:
            raise ValueError(f"unknown initializer {initializer!r}; use 'random'/'normal', "
                             "'uniform', 'zeros', 'ones', a float string or a TF initializer")
    config = getattr(initializer, "get_config", lambda: None)()
    name = type(initializer).__name__
    if config is not None and name in ("RandomNormal", "TruncatedNormal"):
        return "normal", float(config["mean"]), float(config["stddev"])
    if config is not None and name == "RandomUniform":
        return "uniform", float(config["minval"]), float(config["maxval"])
    if config is not None and name == "Constant":
        return "constant", float(config["value"]), 0.0
    if config is not None and name in ("Zeros", "Ones"):
        return "constant", 0.0 if name == "Zeros" else 1.0, 0.0
    raise ValueError(f"initializer {initializer!r} is not supported by dynamic tables: a key's "
                     "initial row must depend only on (seed, key); use RandomNormal, "
                     "TruncatedNormal (sampled untruncated), RandomUniform, Constant, Zeros, Ones")


_VALUE_DTYPES = (tf.float32, tf.float16, tf.bfloat16)


def _initializer_from_spec(kind, a, b):
    """The initializer argument that _parse_initializer reads back as (kind, a, b)."""
    if kind == "normal":
        return tf.keras.initializers.RandomNormal(mean=a, stddev=b)
    if kind == "uniform":
        return tf.keras.initializers.RandomUniform(minval=a, maxval=b)
    return repr(float(a))


@registration.register_serializable(package="sok", name="DynamicVariable")
class DynamicVariable(PlacedTable, resource_variable_ops.BaseResourceVariable):
    """A hash-backed embedding table of rows [dimension] keyed by int64 or int32 ids.

    Args:
      dimension: floats per row.
      initializer: "random"/"normal" (default, N(0, 0.05)), "uniform", "zeros", "ones", a float
        string, or a Keras RandomNormal / RandomUniform / Constant initializer. The initial row
        of a key depends only on (seed, key), so every worker count agrees.
      var_type: None or "hbm" (the table lives where it is created, in GPU memory under a GPU
        device, in host memory on the CPU) or "hybrid": on a GPU, a tiered table whose rows
        in use, with their optimizer state, stay in GPU memory within `max_hbm_for_vectors`
        GB (default 16, as SOK) or `hbm_budget_bytes` bytes, the rest in host memory; a
        budget that holds the whole table gives the all-GPU table. On the CPU a hybrid
        table is the host table.
      name: the table's name (also seeds its initializer).
      key_type: tf.int64 (default) or tf.int32.
      dtype: how rows are stored: tf.float32 (default), tf.float16 or tf.bfloat16 (half the
        memory). Reads, lookups and gradients are float32 whatever the storage; each write
        (insert, assign, optimizer update) rounds to it. Optimizer state stays float32.
      mode: None / "distributed" (key k on worker uint64(k) % N) or "localized:K".
      trainable: whether GradientTape watches it and Keras lists it as trainable.
      constraint: as tf.Variable's, stored; sok.OptimizerWrapper's fused updates do not
        apply it.
      **config: init_capacity, max_capacity (keys this worker holds; default 64Mi, as
        SOK's hybrid tables), evict_strategy ("lru" / "kLru", the default as in SOK, "lfu" /
        "kLfu", "kCustomized" evicting by LRU, or None: a full table then raises
        ResourceExhaustedError), filter_ratio, max_hbm_for_vectors / hbm_budget_bytes (see
        var_type), and SOK's other HierarchicalKV options
        (accepted with a warning: they do not apply here).
    """

    def __init__(self, dimension, initializer=None, var_type=None, name=None, key_type=None,
                 dtype=None, mode=None, trainable=True, constraint=None, **config):
        communication._require_init()
        unknown = sorted(set(config) - set(VALID_CONFIG))
        if unknown:
            raise ValueError(f"unknown DynamicVariable config {unknown}; valid keys are "
                             f"{VALID_CONFIG}")
        if not isinstance(dimension, (int, np.integer)) or dimension < 1:
            raise ValueError(f"dimension must be a positive int, got {dimension!r}")
        if var_type not in _VAR_TYPES:
            raise ValueError(f"unknown var_type {var_type!r}; valid types are {_VAR_TYPES}")
        key_dtype = tf.as_dtype(key_type or tf.int64)
        if key_dtype not in (tf.int64, tf.int32):
            raise TypeError(f"key_type must be int64 or int32, got {key_dtype.name}")
        value_dtype = tf.as_dtype(dtype or tf.float32)
        if value_dtype not in _VALUE_DTYPES:
            raise TypeError(f"dtype must be one of {[d.name for d in _VALUE_DTYPES]}, got "
                            f"{value_dtype.name}")
        evict = _evict_strategy(config)
        hbm_budget_bytes = _hbm_budget_bytes(var_type, config)
        if 0 < hbm_budget_bytes < dimension * value_dtype.size:
            raise ValueError(f"an HBM budget of {hbm_budget_bytes} bytes holds no row of this "
                             f"table (a row is {dimension * value_dtype.size} bytes)")
        ignored = sorted(set(config) & set(_HINT_CONFIG))
        if ignored:
            warnings.warn(f"DynamicVariable options {ignored} do not apply to sok's table (its "
                          "slots and rows size and place themselves) and are ignored")
        max_capacity = int(config.get("max_capacity", DEFAULT_MAX_CAPACITY))
        init_capacity = int(config.get("init_capacity", min(1024 * 1024, max_capacity)))
        if max_capacity < 1 or init_capacity < 1:
            raise ValueError(f"capacities must be positive, got init_capacity={init_capacity}, "
                             f"max_capacity={max_capacity}")
        filter_ratio = float(config.get("filter_ratio", 1.0))
        if not 0.0 <= filter_ratio <= 1.0:
            raise ValueError(f"filter_ratio must be in [0, 1], got {filter_ratio}")
        kind, a, b = _parse_initializer(initializer)
        # What a SavedModel records to build the table again when it is loaded.
        self._revival = {"dimension": int(dimension), "initializer": [kind, a, b],
                         "key_type": key_dtype.name, "dtype": value_dtype.name,
                         "trainable": bool(trainable),
                         "config": {"init_capacity": init_capacity, "max_capacity": max_capacity,
                                    "evict_strategy": evict, "filter_ratio": filter_ratio}}
        if hbm_budget_bytes:
            self._revival["config"]["hbm_budget_bytes"] = hbm_budget_bytes

        self._key_type = key_dtype
        self._dimension = int(dimension)
        self._placement = parse_mode(mode, communication.num_workers())
        self._name = (name or f"DynamicVariable_{next(_counter)}").split(":")[0]
        self._config = dict(config)
        self._filter_ratio = filter_ratio
        unique_id = f"sok_dynamic_{self._name}_{id(self)}"
        with tf.init_scope():
            handle = raw_ops.sok_dynamic_table_handle(shared_name=unique_id)
            if "GPU" not in handle.device.upper() and not _TIER_ON_HOST:
                hbm_budget_bytes = 0  # a host table: there is no HBM to budget
            self._hbm_budget_bytes = hbm_budget_bytes
            raw_ops.sok_dynamic_table_create(
                handle, dim=self._dimension, init_capacity=init_capacity,
                max_capacity=max_capacity, evict_strategy=evict or "none", initializer=kind,
                init_a=a, init_b=b, seed=zlib.crc32(self._name.encode()),
                value_dtype=value_dtype.name, hbm_budget_bytes=hbm_budget_bytes)
        # A resource variable over the table's handle (as SOK's): name "<name>:0", dtype the
        # storage dtype, shape [None, dimension]; the dense-value methods are overridden below.
        super().__init__(trainable=trainable, shape=[None, self._dimension], dtype=value_dtype,
                         handle=handle, constraint=constraint, name=self._name,
                         unique_id=unique_id, handle_name=self._name, in_graph_mode=False,
                         validate_shape=False)

    def __del__(self):
        try:
            if tf.executing_eagerly():
                tf.raw_ops.DestroyResourceOp(resource=self._handle, ignore_lookup_error=True)
        except Exception:  # noqa: BLE001  (interpreter shutdown: nothing left to free)
            return

    # --- no dense value: what a tf.Variable would read densely is an error that says why ------
    def _no_dense_value(self, *_, **__):
        raise TypeError(
            f"sok.DynamicVariable '{self._name}' has no dense value (its rows are keyed by any "
            "int64 id, not a [rows, dim] array): read rows with tf.nn.embedding_lookup(v, ids), "
            "tf.gather(v, ids) or v.sparse_read(ids), and all of them with sok.export(v)")

    _dense_var_to_tensor = value = read_value = read_value_no_copy = numpy = _no_dense_value
    gather_nd = assign_add = assign_sub = _no_dense_value

    def _read_variable_op(self, no_copy=False):
        self._no_dense_value()

    def is_initialized(self, name=None):
        return tf.constant(True)

    # Compared and hashed by identity (a tf.Variable compares element-wise).
    def __eq__(self, other):
        return self is other

    def __ne__(self, other):
        return self is not other

    def __hash__(self):
        return id(self)

    # the name checkpoints record for resource-variable-like objects
    _shared_name = property(lambda self: self._name)

    # --- SOK attributes ------------------------------------------------------------------------
    key_type = property(lambda self: self._key_type)
    filter_ratio = property(lambda self: self._filter_ratio)
    hbm_budget_bytes = property(lambda self: self._hbm_budget_bytes,
                                doc="Bytes of GPU memory for the rows in use of a tiered table "
                                    "(0: not tiered).")

    @property
    def size(self):
        """The table's shape on this worker, as SOK's property: an int32 tensor
        [keys held, dimension] (`v.size[0]` is the row count)."""
        keys = tf.cast(raw_ops.sok_dynamic_table_size(self._handle), tf.int32)
        return tf.stack([keys, tf.constant(self._dimension, tf.int32)])

    def owns(self, keys):
        """Whether this worker owns each key (bool array)."""
        return self._placement.owner_of(keys) == communication.rank()

    def sparse_read(self, ids, name=None, insert=True):
        """Rows of locally held `ids` (ids.shape + [dimension], float32); missing ids are
        inserted with their initial value (insert=True) or read as zeros. What tf.gather and
        tf.nn.embedding_lookup call; differentiable (IndexedSlices keyed by id)."""
        ids = tf.convert_to_tensor(ids)
        if ids.dtype not in (tf.int32, tf.int64):
            raise TypeError(f"ids of sok.DynamicVariable '{self._name}' must be int32 or int64, "
                            f"got {ids.dtype.name}")
        resource_variable_ops.variable_accessed(self)
        with tf.name_scope(name or "sparse_read"):
            flat = tf.cast(tf.reshape(ids, [-1]), tf.int64)
            rows = raw_ops.sok_dynamic_table_lookup(self._handle, flat, dim=self._dimension,
                                                    insert=insert)
            if ids.shape.rank == 1:
                return rows
            return tf.reshape(rows, tf.concat([tf.shape(ids), [self._dimension]], 0))

    def assign(self, keys, values=None, use_locking=None, name=None, read_value=False):
        """Inserts or overwrites the rows of `keys` on this worker."""
        if values is None:
            raise TypeError(f"sok.DynamicVariable '{self._name}' has no dense value to assign; "
                            "give keys and their rows: assign(keys, values)")
        keys = tf.cast(tf.reshape(keys, [-1]), tf.int64)
        values = tf.convert_to_tensor(values, tf.float32)
        return raw_ops.sok_dynamic_table_assign(self._handle, keys, values, tf.zeros([0, 0]))

    def _scatter(self, sparse_delta, combine):
        keys = tf.cast(sparse_delta.indices, tf.int64)
        current = self.sparse_read(keys)
        return self.assign(keys, combine(current, tf.convert_to_tensor(sparse_delta.values)))

    def scatter_add(self, sparse_delta):
        return self._scatter(sparse_delta, lambda old, delta: old + delta)

    def scatter_sub(self, sparse_delta):
        return self._scatter(sparse_delta, lambda old, delta: old - delta)

    def scatter_update(self, sparse_delta):
        return self._scatter(sparse_delta, lambda old, delta: delta)

    # --- SavedModel: the serving graph gets its own handle op; loading builds the table again
    # (same name, shape, initializer and capacities) and restores its keys and rows. --------
    def _export_to_saved_model_graph(self, object_map=None, tensor_map=None, options=None,
                                     **kwargs):
        handle = raw_ops.sok_dynamic_table_handle(shared_name=self._handle_name)
        exported = object.__new__(type(self))  # this table as the serving graph sees it
        exported.__dict__.update(self.__dict__)
        exported._handle = handle
        object_map[self] = exported
        tensor_map[self._handle] = handle
        return [self._handle]

    def _write_object_proto(self, proto, options):
        proto.user_object.identifier = "sok_dynamic_variable"  # revived by the registration

    def _serialize_to_proto(self, object_proto=None, **kwargs):
        revival = dict(self._revival, name=self._name, mode=self.mode)
        return wrappers_pb2.StringValue(value=json.dumps(revival))

    @classmethod
    def _deserialize_from_proto(cls, proto=None, **kwargs):
        value = wrappers_pb2.StringValue()
        proto.Unpack(value)
        revival = json.loads(value.value)
        config = revival.pop("config")
        revival["initializer"] = _initializer_from_spec(*revival["initializer"])
        return cls(**revival, **config)

    # --- tf.train.Checkpoint: the keys this worker holds, their rows and optimizer state ------
    def _serialize_to_tensors(self):
        keys, values, state = raw_ops.sok_dynamic_table_export(self._handle)
        return {"keys": keys, "values": values, "state": state}

    def _restore_from_tensors(self, restored_tensors):
        return raw_ops.sok_dynamic_table_import(
            self._handle, restored_tensors["keys"], restored_tensors["values"],
            restored_tensors["state"])

    def __repr__(self):
        return (f"<sok.DynamicVariable '{self.name}' dimension={self._dimension} "
                f"key_type={self._key_type.name} mode={self.mode}>")


DYNAMIC_TYPES = (DynamicVariable,)


class DynamicSlot:
    """One optimizer state of a dynamic table, as SOK's `get_slot(table, name)` gives it: a
    view of the [dim] floats kept next to each key's row in the table itself. Reads and writes
    go through the table, eagerly (for inspection, dump and load scripts, not training)."""

    def __init__(self, table, name, index):
        self._table, self._slot, self._index = table, name, index

    @property
    def name(self):
        return f"{self._table.name.split(':')[0]}/{self._slot}:0"

    @property
    def shape(self):
        return tf.TensorShape([None, self._table.dimension])

    @property
    def dtype(self):
        return tf.float32

    def _columns(self, state):
        dim = self._table.dimension
        part = state[:, self._index * dim:(self._index + 1) * dim]
        # A table that no update touched yet keeps no state: its slots read as zeros.
        return part if part.shape[1] == dim else np.zeros([len(state), dim], np.float32)

    def export(self):
        """(keys, state rows) of every key this worker holds, as numpy arrays."""
        keys, _, state = (t.numpy() for t in raw_ops.sok_dynamic_table_export(self._table.handle))
        return keys, self._columns(state)

    def sparse_read(self, ids):
        """This state of `ids` ([n, dim]); a key the table does not hold reads as zeros."""
        keys, rows = self.export()
        ids = np.asarray(tf.reshape(ids, [-1]), np.int64)
        order = np.argsort(keys, kind="stable")
        at = np.minimum(np.searchsorted(keys[order], ids), max(len(keys) - 1, 0))
        found = len(keys) > 0
        hit = (keys[order][at] == ids) if found else np.zeros(len(ids), bool)
        out = np.zeros([len(ids), self._table.dimension], np.float32)
        out[hit] = rows[order][at[hit]]
        return tf.constant(out)

    def assign(self, keys, values):
        """Writes this state of `keys` (which the table must hold); all or nothing."""
        table_keys, table_values, state = (
            t.numpy() for t in raw_ops.sok_dynamic_table_export(self._table.handle))
        keys = np.asarray(tf.reshape(keys, [-1]), np.int64)
        values = np.asarray(values, np.float32).reshape(len(keys), self._table.dimension)
        position = {int(k): i for i, k in enumerate(table_keys)}
        missing = [int(k) for k in keys if int(k) not in position]
        if missing:
            raise ValueError(f"{self.name}: the table holds no key {missing[0]}; nothing written")
        dim = self._table.dimension
        width = max(state.shape[1], (self._index + 1) * dim)
        wide = np.zeros([len(table_keys), width], np.float32)
        wide[:, :state.shape[1]] = state
        wide[[position[int(k)] for k in keys], self._index * dim:(self._index + 1) * dim] = values
        return raw_ops.sok_dynamic_table_import(self._table.handle, table_keys, table_values, wide)

    def __repr__(self):
        return f"<sok.DynamicSlot '{self.name}' of {self._table!r}>"


def export(variable):
    """(keys, values) held by this worker: a dynamic table's keys, or a static table's global
    row ids with its local shard; for a dynamic table's optimizer slot (`get_slot`), the
    table's keys with that state."""
    if isinstance(variable, DynamicSlot):
        keys, rows = variable.export()
        return tf.cast(keys, variable._table.key_type), tf.constant(rows)
    if isinstance(variable, DynamicVariable):
        keys, values, _ = raw_ops.sok_dynamic_table_export(variable.handle)
        return tf.cast(keys, variable.key_type), values
    return tf.constant(variable.global_row_ids()), tf.convert_to_tensor(variable)


def _seconds_since_epoch(moment):
    """A threshold as Unix seconds: a datetime (naive ones are UTC, as in SOK) or seconds."""
    if isinstance(moment, datetime.datetime):
        if moment.tzinfo is None:
            moment = moment.replace(tzinfo=datetime.timezone.utc)
        return moment.timestamp()
    return float(moment)


def incremental_model_dump(variables, time_threshold):
    """The rows of dynamic tables written since a moment, for incremental model updates, with
    SOK's contract.

    Args:
      variables: a `sok.DynamicVariable` or a list of them.
      time_threshold: a `datetime.datetime` (naive ones are UTC, as in SOK), or seconds since
        the Unix epoch as `time.time()` gives; or a list of them, one per variable. Rows
        inserted, assigned or updated by an optimizer after it are dumped. Write times are kept
        to the millisecond (rows written in the threshold's millisecond are included too) for
        49.7 days after the table's creation; later writes all count as recent.

    Returns:
      (keys_list, values_list): per variable, the keys written after the threshold on every
      worker (gathered, as NumPy arrays in the variable's key type) and their rows
      ([n, dimension] float32 NumPy arrays). Every worker gets the whole result.

    Raises:
      TypeError: a variable is not a sok.DynamicVariable (static tables keep no write times).
      ValueError: a list of thresholds whose length is not the number of variables.
    """
    variables = list(variables) if isinstance(variables, (list, tuple)) else [variables]
    for i, variable in enumerate(variables):
        if not isinstance(variable, DynamicVariable):
            raise TypeError(f"incremental_model_dump takes sok.DynamicVariables; variables[{i}] "
                            f"is {type(variable).__name__}")
    thresholds = (list(time_threshold) if isinstance(time_threshold, (list, tuple))
                  else [time_threshold] * len(variables))
    if len(thresholds) != len(variables):
        raise ValueError(f"{len(thresholds)} time thresholds for {len(variables)} variables; "
                         "give one, or one per variable")
    keys_list, values_list = [], []
    for variable, moment in zip(variables, thresholds):
        since = tf.constant(int(round(_seconds_since_epoch(moment) * 1e6)), tf.int64)
        keys, values = raw_ops.sok_dynamic_table_export_written(variable.handle, since)
        keys = communication.allgather(tf.cast(keys, variable.key_type))
        values = communication.allgather(values)
        keys_list.append(keys.numpy())
        values_list.append(values.numpy())
    return keys_list, values_list


def assign(variable, keys, values):
    """Writes `values` to the rows of `keys` on this worker. A static table's keys are global
    row ids this worker must hold; a dynamic table's keys are written here as given, so write
    the keys this worker owns (uint64(key) % workers), the ones its lookups read. A dynamic
    table's optimizer slot takes keys its table holds."""
    if isinstance(variable, (DynamicVariable, DynamicSlot)):
        return variable.assign(keys, values)
    if not isinstance(variable, Variable):
        raise TypeError(f"sok.assign takes a sok.Variable or sok.DynamicVariable, got "
                        f"{type(variable).__name__}")
    keys = np.asarray(keys, np.int64).reshape(-1)
    owned = variable.global_row_ids()
    local = np.searchsorted(owned, keys)
    found = local < len(owned)
    found[found] = owned[local[found]] == keys[found]
    if not found.all():
        bad = int(keys[~found][0])
        raise ValueError(f"sok.assign: row {bad} of '{variable.name}' is not held by worker "
                         f"{communication.rank()} of {communication.num_workers()} (mode "
                         f"{variable.mode}, {variable.global_rows} rows); assign each row on "
                         "the worker that owns it. Nothing was written")
    return variable.scatter_update(tf.IndexedSlices(tf.convert_to_tensor(values, tf.float32),
                                                    tf.constant(local, tf.int64)))


def tier_counts(variable):
    """Where a tiered table's rows are and how they moved since its creation (a dict), or
    None for a table of one tier: hot_keys and host_keys held in each tier, ids_looked_up
    (ids of the training lookups), hot_hits (of them, ids the hot tier served with no row
    moving up; hot_hits / ids_looked_up is the hit rate), moved_up and moved_down (rows moved
    from host memory to the hot tier and back), and seconds: lookup_seconds (in training
    lookups) and of them take_up_seconds (the host table handing out the misses' rows),
    move_down_seconds and move_up_seconds (rows crossing between the tiers), each with the
    waits for the GPU it makes; write_back_seconds (the host inserts of the rows moved down,
    which run beside the step) and write_back_wait_seconds (calls waiting for them)."""
    if not isinstance(variable, DynamicVariable):
        raise TypeError(f"tier_counts takes a sok.DynamicVariable, got {type(variable).__name__}")
    counts = raw_ops.sok_dynamic_table_tier_counts(variable.handle).numpy().tolist()
    if not counts[0]:
        return None
    names = ("hot_keys", "host_keys", "ids_looked_up", "hot_hits", "moved_up", "moved_down")
    times = ("lookup_seconds", "take_up_seconds", "move_down_seconds", "move_up_seconds",
             "write_back_seconds", "write_back_wait_seconds")
    result = dict(zip(names, counts[1:7]))
    result.update((name, nanos * 1e-9) for name, nanos in zip(times, counts[7:]))
    return result


def sparse_read_and_evict(variable, ids):
    """SOK's find-or-insert that reports evictions: the rows of `ids` (missing ids inserted
    with their initial rows, as a training lookup), and the keys the insertion evicted from a
    full table (by its LRU / LFU strategy) with their rows as they were.

    Returns:
      (emb, evicted_keys, evicted_values): emb ids.shape + [dimension] float32, differentiable
      (IndexedSlices keyed by id, as a lookup); evicted_keys [m] in the table's key type and
      evicted_values [m, dimension] float32, empty when nothing was evicted.
    """
    if not isinstance(variable, DynamicVariable):
        raise TypeError(f"sparse_read_and_evict takes a sok.DynamicVariable, got "
                        f"{type(variable).__name__}")
    ids = tf.convert_to_tensor(ids)
    resource_variable_ops.variable_accessed(variable)
    rows, evicted_keys, evicted_values = raw_ops.sok_dynamic_table_lookup_evict(
        variable.handle, tf.cast(tf.reshape(ids, [-1]), tf.int64), dim=variable.dimension)
    if ids.shape.rank != 1:
        rows = tf.reshape(rows, tf.concat([tf.shape(ids), [variable.dimension]], 0))
    return rows, tf.cast(evicted_keys, variable.key_type), evicted_values


def sparse_read_and_erase(variable, ids):
    """Reads the rows of `ids` held on this worker and removes them from the table
    (`sparse_read_and_evict`, as SOK's, keeps them and returns the rows evicted for room)."""
    if not isinstance(variable, DynamicVariable):
        raise TypeError(f"sparse_read_and_erase takes a sok.DynamicVariable, got "
                        f"{type(variable).__name__}")
    values = variable.sparse_read(ids, insert=False)
    with tf.control_dependencies([values]):
        raw_ops.sok_dynamic_table_erase(variable.handle, tf.cast(tf.reshape(ids, [-1]), tf.int64))
    return values


@tf.RegisterGradient("Sok>DynamicTableLookupEvict")
def _lookup_evict_grad(op, grad, *_):
    return [tf.IndexedSlices(tf.convert_to_tensor(grad), op.inputs[1]), None]
