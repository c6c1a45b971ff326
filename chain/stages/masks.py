"""Keras' implicit masks across a cut: a stage whose outgoing tensor carries a mask
(`Embedding(mask_zero=True)` and every mask-propagating layer after it) sends the mask as one
more (boolean) tensor, and the next stage attaches it to its incoming tensor again, so its layers
see the mask the uncut model's layers saw. Without this, the mask would be dropped at the cut
and the next stage would attend to and average over the padding."""

from __future__ import annotations

import keras


@keras.saving.register_keras_serializable(package="chain")
class MaskOf(keras.layers.Layer):
    """The implicit mask Keras attached to the tensor this layer is called on (a boolean tensor)."""

    def call(self, inputs, mask=None):
        return mask

    def compute_mask(self, inputs, mask=None):
        return None


@keras.saving.register_keras_serializable(package="chain")
class WithMask(keras.layers.Layer):
    """`[tensor, mask]` -> the tensor, carrying `mask` as its implicit Keras mask again."""

    def call(self, inputs):
        return inputs[0]

    def compute_mask(self, inputs, mask=None):
        return inputs[1]
