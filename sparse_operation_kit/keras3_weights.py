"""Keras 3 weights over sok tables (imported only when tf.keras is Keras 3).

Keras 3 tracks, trains, checkpoints and saves only its own `keras.Variable`s; a layer's
`tf.Variable` attribute is invisible to `trainable_weights`, `model.fit` and `model.save`.
`TableWeight` is a `keras.Variable` whose value is the sok table itself (not a copy): lookups
read the table, Keras' optimizer updates it, and `.keras` files and checkpoints hold the local
shard as they hold any weight.
"""
import keras


class TableWeight(keras.Variable):
    """The Keras 3 face of a static `sok.Variable`: same handle, shape, dtype and value."""

    def __init__(self, table, name="table"):
        self._sok_table = table
        super().__init__(initializer=_unused_initializer, shape=tuple(table.shape),
                         dtype=table.dtype.name, trainable=table.trainable, name=name)

    def _initialize_with_initializer(self, initializer):
        self._value = self._sok_table  # the tf.Variable Keras reads and assigns

    @property
    def sok_table(self):
        return self._sok_table


def _unused_initializer(shape, dtype=None):
    raise AssertionError("a TableWeight's value is its sok table; nothing is initialised")
