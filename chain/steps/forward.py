"""One stage of the chain as the e2e steps call it: its forward pass, its regularization and,
on the last stage, the loss, each weighted and scaled for the tape (`chain.pipeline.step`
calls it per microbatch, `chain.steps.replica` per replica). A split backward (zero bubble)
also keeps each layer's output (`keep=True`), so that the weights' gradients can start from
the gradients at those outputs instead of going through the whole backward again."""

from __future__ import annotations

from typing import Callable

import keras
import tensorflow as tf

from chain.stages import losses
from chain.stages.stage import Stage


def layer_by_layer(stage: Stage) -> bool:
    """Whether the stage's model is a `keras.Sequential` of distinct layers, which calling one
    layer after the other computes exactly (so each layer's output can be kept)."""
    layers = stage.model.layers
    return isinstance(stage.model, keras.Sequential) and len({id(layer) for layer in layers}) == len(layers) > 0


def _model(stage: Stage, h: tf.Tensor, keep: bool) -> tuple[tf.Tensor, list[tf.Tensor] | None]:
    """The model's output, and with `keep` every layer's output (the last is the model's)."""
    if not keep:
        return stage.model(h, training=True), None
    outputs = []
    for layer in stage.model.layers:
        h = layer(h, training=True)
        outputs.append(h)
    return h, outputs


def chain_forward(stage: Stage, loss: Callable | None = None, keep: bool = False) -> Callable:
    """One stage of the chain. A stage before the last: `fn(h, weight) -> (output,
    regularization x weight, the same scaled for the tape)`, both None when the stage has no
    regularization (`losses.regularization`); the last stage (given `loss`): `fn(h, y, weight)
    -> ((loss + its regularization) x weight, the same scaled for the tape)`. With `keep` (a
    model that `layer_by_layer` allows), each result ends with the list of every layer's output."""
    if loss is None:
        def body(h, weight):
            out, outputs = _model(stage, h, keep)
            reg = losses.regularization(stage.model)
            result = (out, None, None) if reg is None else (out, reg * weight, _scaled(stage, reg * weight))
            return result + (outputs,) if keep else result

        return body

    def fn(h, y, weight):
        out, outputs = _model(stage, h, keep)
        value = loss(y, out)
        reg = losses.regularization(stage.model)
        value = (value if reg is None else value + reg) * weight
        result = (value, _scaled(stage, value))
        return result + (outputs,) if keep else result

    return fn


def _scaled(stage: Stage, value: tf.Tensor) -> tf.Tensor:
    """`value` as the tape differentiates it: times the stage's loss scale under float16."""
    return value if stage.loss_scale is None else stage.loss_scale.scale_loss(value)
