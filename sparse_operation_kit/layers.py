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
import importlib

import numpy as np
import tensorflow as tf

from sparse_operation_kit import _versions, communication
from sparse_operation_kit.dynamic_variable import DynamicVariable
from sparse_operation_kit.lookup import all2all_dense_embedding, lookup_sparse
from sparse_operation_kit.no_xla import NoXla
from sparse_operation_kit.optimizer import OptimizerWrapper
from sparse_operation_kit.variables import Variable

_PACKAGE = "sparse_operation_kit"
KERAS_3 = _versions.tf_keras_is_keras_3()
_SAVED_TABLE = "sok_dynamic_table_"  # prefix of a dynamic table's entries in a .keras file


def _make_table(layer_name, dim, rows, dynamic, mode, initializer, key_dtype, config):
    # In init_scope: Keras 3 may build a layer first inside the traced training step.
    with tf.init_scope():
        if dynamic:
            return DynamicVariable(dim, initializer=initializer or "uniform",
                                   name=f"{layer_name}/table", key_type=key_dtype, mode=mode,
                                   **(config or {}))
        if rows is None:
            raise ValueError(f"layer {layer_name}: a static table needs its number of rows")
        return Variable(shape=[rows, dim],
                        initializer=tf.keras.initializers.get(initializer or "uniform"),
                        mode=mode, name=f"{layer_name}/table")


def _keras_3_weight(table, name):
    """A Keras 3 weight over a static sok table (same handle: no copy). Keras 2 tracks a
    tf.Variable attribute of a layer as a weight itself; Keras 3 tracks only its own
    variables."""
    from sparse_operation_kit.keras3_weights import TableWeight  # noqa: PLC0415  (imports keras)

    return TableWeight(table, name=name)


class _ShapeFreeBuild:
    """For layers whose tables do not depend on the input's shape: a loaded layer makes them
    at once, so its weights can be loaded."""

    def get_build_config(self):
        return {"built": bool(self.built)}

    def build_from_config(self, config):
        if config.get("built") and not self.built:
            self.build(None)


class _TableLayer(NoXla, _ShapeFreeBuild, tf.keras.layers.Layer):
    """Holds one sok table; exposes a dynamic one as `sok_dynamic_table` for `sok.layers.Model`.

    A dynamic table is no Keras weight (it has no dense value; `sok.layers.Model` trains it),
    but it is a dependency of the layer: `tf.train.Checkpoint` of the layer or its model holds
    its keys, rows and optimizer state, and so does a `.keras` file of the model."""

    def _set_table(self, table):
        if isinstance(table, DynamicVariable):
            object.__setattr__(self, "_sok_table", table)  # kept out of Keras' weights
            self._track_trackable(table, name="sok_dynamic_table", overwrite=True)
        elif KERAS_3:
            object.__setattr__(self, "_sok_table", table)
            self._table_weight = _keras_3_weight(table, "table")
        else:
            self._sok_table = table

    def has_table(self):
        """Whether the layer made its table (Keras 3 may build a layer again: it keeps it)."""
        return "_sok_table" in vars(self)

    def save_own_variables(self, store):
        super().save_own_variables(store)
        table = self.sok_dynamic_table
        if table is not None:  # what a checkpoint keeps: keys, rows, optimizer state
            for name, tensor in table._serialize_to_tensors().items():
                store[_SAVED_TABLE + name] = tensor.numpy()

    def load_own_variables(self, store):
        table = self.sok_dynamic_table
        if table is None:
            return super().load_own_variables(store)
        names = list(store.keys())
        super().load_own_variables({n: store[n] for n in names if not n.startswith(_SAVED_TABLE)})
        table._restore_from_tensors({n[len(_SAVED_TABLE):]: tf.constant(np.asarray(store[n]))
                                     for n in names if n.startswith(_SAVED_TABLE)})

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
        if self.has_table():
            return super().build(input_shape)
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
        if self.has_table():
            return super().build(input_shape)
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
class PackedEmbedding(NoXla, _ShapeFreeBuild, tf.keras.layers.Layer):
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
        self._allow_non_tensor_positional_args = True  # Keras 3: a StagedFeatures batch

    def build(self, input_shape):
        communication._require_init()
        if hasattr(self, "tables"):  # built before (Keras 3 may build a layer again)
            return super().build(input_shape)
        tables = [_make_table(f"{self.name}/feature_{f}", self.output_dim, rows, False,
                              self.mode, self.initializer, None, None)
                  for f, rows in enumerate(self.input_dims)]
        if KERAS_3:
            object.__setattr__(self, "tables", tables)
            self._table_weights = [_keras_3_weight(table, f"table_{f}")
                                   for f, table in enumerate(tables)]
        else:
            self.tables = tables
        super().build(input_shape)

    def call(self, inputs, training=None):
        return lookup_sparse(self.tables, inputs, combiners=self._combiners,
                             training=True if training is None else bool(training))

    def get_config(self):
        return dict(super().get_config(), input_dims=self.input_dims, output_dim=self.output_dim,
                    combiner=self.combiner, mode=self.mode,
                    initializer=self.initializer if isinstance(self.initializer, (str, type(None)))
                    else tf.keras.initializers.serialize(self.initializer))


@tf.keras.utils.register_keras_serializable(package=_PACKAGE)
class Model(NoXla, tf.keras.Model):
    """A Keras model whose `fit` trains dynamic sok tables too, through
    `sok.OptimizerWrapper(self.optimizer)`; everything else as `tf.keras.Model`. Under Keras 3
    it may also be called with a batch staged by `sok.stage_features` (Keras 3 takes only
    tensors as a plain model's inputs)."""

    def __new__(cls, *args, **kwargs):
        # Keras makes a Model subclass called with inputs and outputs functional by rewriting
        # the class's bases, after which no subclass of it builds without them: a functional
        # sok Model is a FunctionalModel instead, and this class keeps its bases.
        if cls is Model and _functional_arguments(args, kwargs):
            return tf.keras.Model.__new__(FunctionalModel, *args, **kwargs)
        return super().__new__(cls, *args, **kwargs)

    # Keras 3 takes only tensors as a model's positional inputs unless this is set; a property,
    # not __init__, so that Keras 2 still serialises a functional sok Model as functional.
    @property
    def _allow_non_tensor_positional_args(self):
        return True

    @_allow_non_tensor_positional_args.setter
    def _allow_non_tensor_positional_args(self, _):
        pass  # Keras 3's Layer.__init__ sets False

    def sok_dynamic_tables(self):
        """The trainable dynamic tables of its layers (sok layers' tables, and DynamicVariable
        attributes of any layer or of the model itself)."""
        tables = []
        for layer in self._flatten_layers(include_self=True):
            for table in vars(layer).values():  # a sok layer's own table included
                if (isinstance(table, DynamicVariable) and table.trainable and
                        all(table is not seen for seen in tables)):
                    tables.append(table)
        return tables

    def train_step(self, data):
        x, y, sample_weight = tf.keras.utils.unpack_x_y_sample_weight(data)
        with tf.GradientTape() as tape:
            y_pred = self(x, training=True)
            loss = self.compute_loss(x=x, y=y, y_pred=y_pred, sample_weight=sample_weight)
            if KERAS_3:  # Keras 3 reports the loss through this tracker, not compute_loss
                self._loss_tracker.update_state(
                    loss, sample_weight=tf.shape(tf.nest.flatten(y_pred)[0])[0])
        dynamic = self.sok_dynamic_tables()  # after the call, which may have built the layers
        variables = list(self.trainable_variables)
        variables += [t for t in dynamic if all(t is not v for v in variables)]
        grads = tape.gradient(loss, variables)
        OptimizerWrapper(self.optimizer).apply_gradients(
            [(g, v) for g, v in zip(grads, variables) if g is not None])
        return self.compute_metrics(x, y, y_pred, sample_weight)


def _functional_arguments(args, kwargs):
    """Whether a model is built from inputs and outputs (Keras' own test)."""
    return (len(args) == 2 or (len(args) == 1 and "outputs" in kwargs) or
            ("inputs" in kwargs and "outputs" in kwargs))


# Keras' functional model class, beside its Model (keras.src.models / keras.src.engine /
# tf_keras.src.engine).
_Functional = importlib.import_module(
    tf.keras.Model.__module__.rsplit(".", 1)[0] + ".functional").Functional


@tf.keras.utils.register_keras_serializable(package=_PACKAGE)
class FunctionalModel(Model, _Functional):
    """What `sok.layers.Model(inputs, outputs)` builds: a functional Keras model with
    `Model`'s training of dynamic tables."""
