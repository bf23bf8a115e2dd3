"""DLRM with sok embedding tables: bottom MLP 512-256-D, 26 tables looked up in one fused
sok.lookup_sparse, dot interaction, top MLP 1024-1024-512-256-1.

`embedding="keras"` builds the same model with tf.keras.layers.Embedding tables (the C6
competitor), replicated on every worker (main.py allreduces their gradients).
`embedding="none"` has no tables: every categorical feature reads as zeros, so a step costs
the dense part alone (C6's bound on what any embedding can gain).
"""
import tensorflow as tf

import sparse_operation_kit as sok
from sparse_operation_kit.interaction import dot_interaction_reference


def mlp(widths, last_activation="relu", name=None, seed=0):
    """Dense layers with seeded initializers: every worker builds the same starting weights
    (the dense part is replicated and its gradients allreduced), with no broadcast."""
    def dense(i, width, **kwargs):
        return tf.keras.layers.Dense(
            width, kernel_initializer=tf.keras.initializers.GlorotUniform(seed=seed + i),
            **kwargs)
    layers = [dense(i, w, activation="relu") for i, w in enumerate(widths[:-1])]
    layers.append(dense(len(widths) - 1, widths[-1], activation=last_activation,
                        dtype="float32" if last_activation is None else None))
    return tf.keras.Sequential(layers, name=name)


class DLRM:
    def __init__(self, vocab_sizes, dim=128, embedding="static", custom_interact=True,
                 xla=False, compress=False):
        self.embedding = embedding
        self.custom_interact = custom_interact
        self.compress = compress  # float16 embedding all-to-all
        initializer = lambda: tf.keras.initializers.RandomUniform(-0.05, 0.05)  # noqa: E731
        if embedding == "static":
            self.tables = [sok.Variable(shape=[v, dim], initializer=initializer(), name=f"table{i}")
                           for i, v in enumerate(vocab_sizes)]
        elif embedding == "dynamic":
            self.tables = [sok.DynamicVariable(dim, initializer=initializer(), name=f"table{i}",
                                               init_capacity=min(v, 1 << 22))
                           for i, v in enumerate(vocab_sizes)]
        elif embedding == "keras":
            # Seeded: replicas on several workers start equal without a broadcast of the tables.
            self.keras_tables = [tf.keras.layers.Embedding(
                v, dim, embeddings_initializer=tf.keras.initializers.RandomUniform(-0.05, 0.05,
                                                                                   seed=i))
                for i, v in enumerate(vocab_sizes)]
            for table in self.keras_tables:
                table.build(None)
            self.tables = [table.embeddings for table in self.keras_tables]
        elif embedding == "none":
            self.tables = []
            self.zero_features = (len(vocab_sizes), dim)
        else:
            raise ValueError(f"unknown embedding {embedding!r}; use static, dynamic, keras or none")
        self.bottom = mlp([512, 256, dim], name="bottom")
        self.top = mlp([1024, 1024, 512, 256, 1], last_activation=None, name="top", seed=100)
        self.bottom.build([None, 13])
        self.top.build([None, dim + (len(vocab_sizes) + 1) * len(vocab_sizes) // 2])
        self._bottom = tf.function(self.bottom, jit_compile=True) if xla else self.bottom
        self._top = tf.function(self.top, jit_compile=True) if xla else self.top
        self._reference_interaction = (tf.function(dot_interaction_reference, jit_compile=True)
                                       if xla else dot_interaction_reference)

    @property
    def dense_variables(self):
        return self.bottom.trainable_variables + self.top.trainable_variables

    def embeddings(self, categorical, training):
        if self.embedding == "keras":
            return [tf.cast(table(categorical[:, i]), tf.float32)  # float16 under --amp
                    for i, table in enumerate(self.keras_tables)]
        if self.embedding == "none":
            count, dim = self.zero_features
            return [tf.zeros([tf.shape(categorical)[0], dim])] * count
        ids = [tf.RaggedTensor.from_tensor(categorical[:, i:i + 1]) for i in range(len(self.tables))]
        return sok.lookup_sparse(self.tables, ids, combiners=["sum"] * len(self.tables),
                                 training=training, compress=self.compress)

    def __call__(self, dense, categorical, training=True):
        bottom = tf.cast(self._bottom(dense), tf.float32)
        features = tf.stack([bottom] + self.embeddings(categorical, training), axis=1)
        if self.custom_interact:
            # Under mixed precision (--amp) the fused op runs in float16, summing in float32.
            compute_dtype = tf.keras.mixed_precision.global_policy().compute_dtype
            interaction = sok.dot_interaction(tf.cast(features, compute_dtype))
        else:
            interaction = self._reference_interaction(features)
        return tf.cast(self._top(interaction), tf.float32)
