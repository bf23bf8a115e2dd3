"""What keeps Keras 3 from compiling a model's step with XLA: sok's ops have no XLA kernels,
and Keras 3 compiles `fit`'s step with XLA on a GPU (`jit_compile="auto"`) unless a layer of
the model says it cannot."""


class NoXla:
    """Mixed into a Keras layer or model: `supports_jit` is False. A property, since Keras 3's
    Layer.__init__ sets the attribute True; Keras 2 never reads it."""

    @property
    def supports_jit(self):
        return False

    @supports_jit.setter
    def supports_jit(self, _):
        pass
