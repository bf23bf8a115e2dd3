"""Keras layers over sok tables.

- `Embedding`: a static or dynamic table, any placement; pooled lookups of ragged / sparse ids
  with a combiner, or unpooled lookups of dense ids.
- `DistributedEmbedding` and `All2AllDenseEmbedding`: SOK v1's layers, same signatures and
  output shapes (all slots share one table, as in SOK v1).
- `PackedEmbedding`: a group of static tables of one dimension, looked up from one packed
  batch (or one staged by `sok.stage_features`) into one [batch, features, dim] tensor.
- `Model`: a `tf.keras.Model` whose `fit` also trains dynamic tables (their gradients go
  through `sok.OptimizerWrapper(model.optimizer)`); static tables are ordinary trainable
  weights and train with any Keras optimizer in any model.
"""
import tensorflow as tf

from sparse_operation_kit import communication
from sparse_operation_kit.dynamic_variable import DynamicVariable
from sparse_operation_kit.lookup import all2all_dense_embedding, lookup_sparse
from sparse_operation_kit.optimizer import OptimizerWrapper
from sparse_operation_kit.variables import Variable

_PACKAGE = "sparse_operation_kit"


def _make_table(layer_name, dim, rows, dynamic, mode, initializer, key_dtype, config):
    if dynamic:
        return DynamicVariable(dim, initializer=initializer or "uniform", name=f"{layer_name}/table",
                               key_type=key_dtype, mode=mode, **(config or {}))
    if rows is None:
        raise ValueError(f"layer {layer_name}: a static table needs its number of rows")
    return Variable(shape=[rows, dim], initializer=tf.keras.initializers.get(initializer or "uniform"),
                    mode=mode, name=f"{layer_name}/table")


class _TableLayer(tf.keras.layers.Layer):
    """Holds one sok table; exposes a dynamic one as `sok_dynamic_table` for `sok.layers.Model`."""

    def _set_table(self, table):
        if isinstance(table, DynamicVariable):
            # Not a tf.Variable: kept out of Keras' weight tracking, trained via sok.layers.Model.
            object.__setattr__(self, "_sok_table", table)
        else:
            self._sok_table = table

    @property
    def table(self):
        return self._sok_table

    @property
    def embedding_variable(self):
        """SOK v1's name for the layer's table."""
        return self._sok_table

    @property
    def sok_dynamic_table(self):
        table = getattr(self, "_sok_table", None)
        return table if isinstance(table, DynamicVariable) else None


class _SokV1Layer(_TableLayer):
    """What SOK v1's layers share: their table's arguments, its build and their config."""

    def __init__(self, max_vocabulary_size_per_gpu, embedding_vec_size, slot_num,
                 use_hashtable=True, key_dtype=None, embedding_initializer=None, **kwargs):
        super().__init__(**kwargs)
        self.max_vocabulary_size_per_gpu = int(max_vocabulary_size_per_gpu)
        self.embedding_vec_size, self.slot_num = int(embedding_vec_size), int(slot_num)
        self.use_hashtable, self.key_dtype = bool(use_hashtable), key_dtype
        self.embedding_initializer = embedding_initializer

    def build(self, input_shape):
        """SOK v1's table: a hash table capped at max_vocabulary_size_per_gpu keys, or a static
        table of that many rows per worker, distributed."""
        communication._require_init()
        per_worker = self.max_vocabulary_size_per_gpu
        self._set_table(_make_table(
            self.name, self.embedding_vec_size, per_worker * communication.num_workers(),
            self.use_hashtable, None, self.embedding_initializer, self.key_dtype,
            {"max_capacity": per_worker} if self.use_hashtable else None))
        super().build(input_shape)

    def get_config(self):
        return dict(super().get_config(),
                    max_vocabulary_size_per_gpu=self.max_vocabulary_size_per_gpu,
                    embedding_vec_size=self.embedding_vec_size, slot_num=self.slot_num,
                    use_hashtable=self.use_hashtable,
                    key_dtype=None if self.key_dtype is None else tf.as_dtype(self.key_dtype).name,
                    embedding_initializer=self.embedding_initializer)


@tf.keras.utils.register_keras_serializable(package=_PACKAGE)
class Embedding(_TableLayer):
    """An embedding layer over a sok table.

    Args:
      output_dim: width of a row.
      input_dim: rows of a static table (ignored when dynamic).
      combiner: "sum", "mean" or "sqrtn" for ragged / sparse inputs.
      mode: None / "distributed" / "localized:K".
      dynamic_table: a hash table (`sok.DynamicVariable`) instead of a static one.
      initializer: a Keras initializer (name) for static tables; a sok initializer name
        ("uniform", "normal", "zeros", ...) for dynamic ones.
      key_dtype: int64 (default) or int32, dynamic tables.
      table_config: DynamicVariable config (max_capacity, evict_strategy, ...).

    Call: ragged / sparse ids [batch, None] -> pooled [batch, output_dim]; dense ids of any
    shape -> [*ids.shape, output_dim]. With ragged / sparse ids, `training=False` reads the
    missing ids of a dynamic table as zeros without inserting them; dense ids always
    find-or-insert.
    """

    def __init__(self, output_dim, input_dim=None, combiner="mean", mode=None,
                 dynamic_table=False, initializer="uniform", key_dtype=None, table_config=None,
                 **kwargs):
        super().__init__(**kwargs)
        self.output_dim, self.input_dim = int(output_dim), input_dim
        self.combiner, self.mode, self.dynamic_table = combiner, mode, bool(dynamic_table)
        self.initializer, self.key_dtype = initializer, key_dtype
        self.table_config = dict(table_config or {})

    def build(self, input_shape):
        communication._require_init()
        self._set_table(_make_table(self.name, self.output_dim, self.input_dim, self.dynamic_table,
                                    self.mode, self.initializer, self.key_dtype, self.table_config))
        super().build(input_shape)

    def call(self, inputs, training=None):
        training = True if training is None else bool(training)
        if isinstance(inputs, (tf.RaggedTensor, tf.SparseTensor)):
            return lookup_sparse([self.table], [inputs], combiners=[self.combiner],
                                 training=training)[0]
        return all2all_dense_embedding(self.table, inputs)

    def get_config(self):
        return dict(super().get_config(), output_dim=self.output_dim, input_dim=self.input_dim,
                    combiner=self.combiner, mode=self.mode, dynamic_table=self.dynamic_table,
                    initializer=self.initializer if isinstance(self.initializer, (str, type(None)))
                    else tf.keras.initializers.serialize(self.initializer),
                    key_dtype=None if self.key_dtype is None else tf.as_dtype(self.key_dtype).name,
                    table_config=self.table_config)


@tf.keras.utils.register_keras_serializable(package=_PACKAGE)
class DistributedEmbedding(_SokV1Layer):
    """SOK v1's DistributedEmbedding: every slot's keys index one shared table.

    Call: a SparseTensor (or RaggedTensor) of dense shape [batch * slot_num, max_nnz] ->
    [batch, slot_num, embedding_vec_size], each slot pooled with `combiner`.
    """

    def __init__(self, combiner, max_vocabulary_size_per_gpu, embedding_vec_size, slot_num,
                 max_nnz, max_feature_num=1, use_hashtable=True, key_dtype=None,
                 embedding_initializer=None, **kwargs):
        super().__init__(max_vocabulary_size_per_gpu, embedding_vec_size, slot_num,
                         use_hashtable, key_dtype, embedding_initializer, **kwargs)
        self.combiner = combiner
        self.max_nnz, self.max_feature_num = int(max_nnz), int(max_feature_num)

    def call(self, inputs, training=None):
        pooled = lookup_sparse([self.table], [inputs], combiners=[self.combiner],
                               training=True if training is None else bool(training))[0]
        return tf.reshape(pooled, [-1, self.slot_num, self.embedding_vec_size])

    def get_config(self):
        return dict(super().get_config(), combiner=self.combiner, max_nnz=self.max_nnz,
                    max_feature_num=self.max_feature_num)


@tf.keras.utils.register_keras_serializable(package=_PACKAGE)
class All2AllDenseEmbedding(_SokV1Layer):
    """SOK v1's All2AllDenseEmbedding: unpooled lookups of dense ids.

    Call: ids [batch, slot_num, nnz_per_slot] -> [batch, slot_num, nnz_per_slot, vec_size];
    with dynamic_input=True, ids of any length -> [n, vec_size].
    """

    def __init__(self, max_vocabulary_size_per_gpu, embedding_vec_size, slot_num, nnz_per_slot,
                 dynamic_input=False, use_hashtable=True, key_dtype=None,
                 embedding_initializer=None, **kwargs):
        super().__init__(max_vocabulary_size_per_gpu, embedding_vec_size, slot_num,
                         use_hashtable, key_dtype, embedding_initializer, **kwargs)
        self.nnz_per_slot, self.dynamic_input = int(nnz_per_slot), bool(dynamic_input)

    def call(self, inputs, training=None):
        if self.dynamic_input:
            return all2all_dense_embedding(self.table, tf.reshape(inputs, [-1]))
        rows = all2all_dense_embedding(self.table, inputs)
        return tf.reshape(rows, [-1, self.slot_num, self.nnz_per_slot, self.embedding_vec_size])

    def get_config(self):
        return dict(super().get_config(), nnz_per_slot=self.nnz_per_slot,
                    dynamic_input=self.dynamic_input)


@tf.keras.utils.register_keras_serializable(package=_PACKAGE)
class PackedEmbedding(tf.keras.layers.Layer):
    """A group of static tables of one dimension looked up from one packed batch.

    `input_dims[f]` rows for feature f, each table `output_dim` wide, pooled with `combiner`
    (one for all, or one a feature). Call: a feature-major packed `tf.RaggedTensor`
    [features * batch, None] of ids (feature 0's samples, then feature 1's, as TorchRec's
    KeyedJaggedTensor), or that batch staged by `sok.stage_features` in the input pipeline ->
    [batch, features, output_dim], as DLRM's interaction takes it. The tables are ordinary
    trainable weights (any Keras optimizer; `sok.OptimizerWrapper` updates them sparsely).
    """

    def __init__(self, input_dims, output_dim, combiner="mean", mode=None,
                 initializer="uniform", **kwargs):
        super().__init__(**kwargs)
        self.input_dims = [int(rows) for rows in input_dims]
        if not self.input_dims or min(self.input_dims) < 1:
            raise ValueError(f"input_dims must list each feature's rows (>= 1), got {input_dims!r}")
        self.output_dim, self.mode, self.initializer = int(output_dim), mode, initializer
        combiners = combiner if isinstance(combiner, (list, tuple)) else [combiner] * len(
            self.input_dims)
        if len(combiners) != len(self.input_dims):
            raise ValueError(f"combiner lists {len(combiners)} combiners for "
                             f"{len(self.input_dims)} features")
        self.combiner = combiner if isinstance(combiner, str) else list(combiner)
        self._combiners = list(combiners)

    def build(self, input_shape):
        communication._require_init()
        self.tables = [_make_table(f"{self.name}/feature_{f}", self.output_dim, rows, False,
                                   self.mode, self.initializer, None, None)
                       for f, rows in enumerate(self.input_dims)]
        super().build(input_shape)

    def call(self, inputs, training=None):
        return lookup_sparse(self.tables, inputs, combiners=self._combiners,
                             training=True if training is None else bool(training))

    def get_config(self):
        return dict(super().get_config(), input_dims=self.input_dims, output_dim=self.output_dim,
                    combiner=self.combiner, mode=self.mode,
                    initializer=self.initializer if isinstance(self.initializer, (str, type(None)))
                    else tf.keras.initializers.serialize(self.initializer))


class Model(tf.keras.Model):
    """A Keras model whose `fit` trains dynamic sok tables too, through
    `sok.OptimizerWrapper(self.optimizer)`; everything else as `tf.keras.Model`."""

    def sok_dynamic_tables(self):
        tables = []
        for layer in self._flatten_layers(include_self=False):
            table = getattr(layer, "sok_dynamic_table", None)
            if table is not None and all(table is not t for t in tables):
                tables.append(table)
        return tables

    def train_step(self, data):
        x, y, sample_weight = tf.keras.utils.unpack_x_y_sample_weight(data)
        dynamic = self.sok_dynamic_tables()
        with tf.GradientTape() as tape:
            y_pred = self(x, training=True)
            loss = self.compute_loss(x, y, y_pred, sample_weight)
        variables = list(self.trainable_variables) + dynamic
        grads = tape.gradient(loss, variables)
        OptimizerWrapper(self.optimizer).apply_gradients(
            [(g, v) for g, v in zip(grads, variables) if g is not None])
        return self.compute_metrics(x, y, y_pred, sample_weight)
