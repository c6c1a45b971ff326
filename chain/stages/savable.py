"""chain's own Keras classes that a run's saved files hold (`chain.keras`, `stage_NN.keras`, a checkpoint's
optimizer): `model=gpt`'s `TokenEmbedding`, a cut model's borrowed layer `Lent` and its mask layers
`MaskOf`/`WithMask`, the warm-up schedule `Warmup`. Each is registered with Keras as `chain>NAME` when this
module is imported (`chain.stages.registered` imports it once Keras is).

It imports Keras and nothing of chain but `chain.internals`: `chain.stages.registered` imports it right after
Keras' own import ends, which may be in the middle of importing any other module of chain.
"""

from __future__ import annotations

import keras
from keras import ops

from chain.internals.keras_private import untrack_attribute, untrack_sublayer


@keras.saving.register_keras_serializable(package="chain")
class TokenEmbedding(keras.layers.Embedding):
    """`keras.layers.Embedding` that also reads out: `layer(h, reverse=True)` is `h @ embeddings^T`,
    logits over the vocabulary from the same weight (keras_hub's `ReversibleEmbedding` call, without its
    extras), so a tied model stays a Keras functional model the cut can split."""

    def call(self, inputs, reverse: bool = False):
        if reverse:
            return ops.matmul(
                ops.cast(inputs, self.compute_dtype), ops.transpose(ops.cast(self.embeddings, self.compute_dtype))
            )
        return super().call(inputs)

    def compute_output_shape(self, input_shape, reverse: bool = False):
        if reverse:
            return (*tuple(input_shape)[:-1], self.input_dim)
        return super().compute_output_shape(input_shape)

    def compute_output_spec(self, inputs, reverse: bool = False):
        shape = self.compute_output_shape(inputs.shape, reverse=reverse)
        return keras.KerasTensor(shape, dtype=self.compute_dtype)


@keras.saving.register_keras_serializable(package="chain")
class Warmup(keras.optimizers.schedules.LearningRateSchedule):
    """A linear warm-up from 0 to `peak` over `steps` steps (Keras' `CosineDecay` formula), then
    `after` (a schedule, or None: `peak`) counted from the warm-up's end."""

    def __init__(self, peak: float, steps: int, after: keras.optimizers.schedules.LearningRateSchedule | None = None):
        super().__init__()
        self.peak, self.steps, self.after = peak, steps, after

    def __call__(self, step):
        peak = ops.convert_to_tensor(self.peak)
        step = ops.cast(step, peak.dtype)
        if self.steps == 0:
            return peak if self.after is None else self.after(step)
        warm = ops.cast(self.steps, peak.dtype)
        rest = (lambda: peak) if self.after is None else (lambda: self.after(step - warm))
        return ops.cond(step < warm, lambda: peak * (step / warm), rest)

    def get_config(self) -> dict:
        return {
            "peak": self.peak,
            "steps": self.steps,
            "after": None if self.after is None else keras.optimizers.schedules.serialize(self.after),
        }

    @classmethod
    def from_config(cls, config: dict) -> "Warmup":
        args = dict(config)  # get_config's keys are the constructor's
        after = args.pop("after", None)
        return cls(**args, after=None if after is None else keras.optimizers.schedules.deserialize(after))


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


@keras.saving.register_keras_serializable(package="chain")
class Lent(keras.layers.Layer):
    """An earlier stage's clone on this stage's device, called again here (keras_hub's
    `token_embedding(h, reverse=True)` on a later stage of the same device): the stage's model calls
    it through this layer, which does not hold it, so its variable stays the earlier stage's (that
    stage's optimizer and checkpoint) and this stage borrows it (`Stage.borrowed`). The stage's own
    file (`stage_NN.keras`, the stage as it computes) saves the layer and its weights with it."""

    def __init__(self, layer: keras.layers.Layer, **kwargs):
        kwargs.setdefault("name", f"{layer.name}_lent")
        super().__init__(dtype=layer.dtype_policy, **{k: v for k, v in kwargs.items() if k != "dtype"})
        self.layer = layer
        untrack_sublayer(self, layer)  # its weights are not this layer's (nor the stage model's)
        untrack_attribute(self, "layer")  # nor in this stage's checkpoint
        self.built = True

    def call(self, inputs, **kwargs):
        return self.layer(inputs, **kwargs)

    def compute_output_spec(self, inputs, **kwargs):  # the lent layer's own (Keras' tracing of `call` failed
        return self.layer.compute_output_spec(inputs, **kwargs)  # on T5's read-out)

    def get_config(self) -> dict:
        return {**super().get_config(), "layer": keras.saving.serialize_keras_object(self.layer)}

    @classmethod
    def from_config(cls, config: dict) -> "Lent":
        return cls(keras.saving.deserialize_keras_object(config.pop("layer")), **config)


@keras.saving.register_keras_serializable(package="chain")
class SegmentPositions(keras.layers.Layer):
    """Packed windows (`data.pack`): each token's position within its segment, from the segment ids (B, T)
    (1, 2, ... one per example, increasing along the window; 0 pads its end): its index less the tokens of
    the segments before its own, so positions restart at 0 with every example."""

    def call(self, segment_ids):
        before = ops.logical_and(
            ops.less(segment_ids[:, None, :], segment_ids[:, :, None]), ops.greater(segment_ids[:, None, :], 0)
        )
        index = ops.cumsum(ops.ones_like(segment_ids), axis=1) - 1
        return index - ops.cast(ops.sum(ops.cast(before, "int32"), axis=-1), index.dtype)

    def compute_output_spec(self, segment_ids):
        return keras.KerasTensor(segment_ids.shape, dtype=segment_ids.dtype)


@keras.saving.register_keras_serializable(package="chain")
class SegmentMask(keras.layers.Layer):
    """Packed windows (`data.pack`): the attention mask (B, T, T) that lets a token see only its own segment
    (the causal mask is the attention's own), made inside each block from the segment ids, so only the (B, T)
    ids cross a cut."""

    def call(self, segment_ids):
        return ops.equal(segment_ids[:, :, None], segment_ids[:, None, :])

    def compute_output_spec(self, segment_ids):
        b, t = segment_ids.shape
        return keras.KerasTensor((b, t, t), dtype="bool")
