"""One stage of the chain as the e2e steps call it: its forward pass, its regularization and,
on the last stage, the loss, each weighted and scaled for the tape (`chain.pipeline.play`
calls it per microbatch, `chain.steps.replica` per replica). A split backward (zero bubble)
also keeps each layer's output (`keep=True`), so that the weights' gradients can start from
the gradients at those outputs instead of going through the whole backward again."""

from __future__ import annotations

from typing import Callable, NamedTuple

import keras
import tensorflow as tf

from chain.internals.keras_private import graph_nodes, plain_functional, run_graph
from chain.stages import losses
from chain.stages.stage import Stage


class Kept(NamedTuple):
    """A layer's call in a kept forward: the layer, the tensors it was given, its output."""

    layer: keras.layers.Layer
    inputs: list[tf.Tensor]
    output: tf.Tensor


def _functional_calls(model: keras.Model) -> list[keras.layers.Layer] | None:
    """The layers a plain functional model calls, in the order it calls them, when each layer that
    has trainable weights is called once and gives one tensor; else None (then its layers' outputs
    are not kept). A subclass with its own `call` is not plain: its graph may not be what runs."""
    if not plain_functional(model):
        return None
    calls, outputs = [], {}
    for node in graph_nodes(model):  # in the order its graph walk runs them
        if node.operation is not None and not node.is_input:
            calls.append(node.operation)
            outputs[id(node.operation)] = len(keras.tree.flatten(node.outputs))
    trainable = [op for op in calls if getattr(op, "trainable_variables", None)]
    if len({id(op) for op in trainable}) != len(trainable):
        return None  # a layer called twice: one output would not hold all its weights' uses
    if any(not isinstance(op, keras.layers.Layer) or outputs[id(op)] != 1 for op in trainable):
        return None
    return calls


def layer_by_layer(stage: Stage) -> bool:
    """Whether each layer's output can be kept while the stage's model runs exactly as it does when
    called: a `keras.Sequential` of distinct layers (called one after the other), or a plain
    functional model (a cut Keras model, a functional builder; `_functional_calls`)."""
    model = stage.model
    layers = model.layers
    if not layers or len({id(layer) for layer in layers}) != len(layers):
        return False
    return isinstance(model, keras.Sequential) or _functional_calls(model) is not None


def _model(stage: Stage, h: tf.Tensor, keep: bool) -> tuple[tf.Tensor, list[Kept] | None]:
    """The model's output, and with `keep` every layer call that has trainable weights (`Kept`)."""
    if not keep:
        return stage.model(h, training=True), None
    want = stage.model.inputs[0].dtype if stage.model.inputs else None
    if want is not None and tf.is_tensor(h) and h.dtype != want:  # as the model's own call converts (integer
        h = tf.cast(h, want)  # ids, a float Input); a structure (several tensors cross) keeps its leaves' dtypes
    kept = []  # the weighted calls, in order
    if isinstance(stage.model, keras.Sequential):
        for layer in stage.model.layers:
            out = layer(h, training=True)
            if layer.trainable_variables:
                kept.append(Kept(layer, [h], out))
            h = out
        return h, kept

    def recorded(op, call):  # `call`: what `Functional.call` runs for the node
        if not getattr(op, "trainable_variables", None):
            return call

        def run(*args, **kwargs):
            out = call(*args, **kwargs)
            kept.append(Kept(op, [t for t in keras.tree.flatten((args, kwargs)) if tf.is_tensor(t)], out))
            return out

        return run

    # The functional model's own graph walk (the one its `call` runs, with the same per-node call),
    # recording each weighted layer's call on the way.
    return run_graph(stage.model, h, recorded, training=True), kept


def chain_forward(stage: Stage, loss: Callable | None = None, keep: bool = False) -> Callable:
    """One stage of the chain. A stage before the last: `fn(h, weight) -> (output,
    regularization x weight, the same scaled for the tape)`, both None when the stage has no
    regularization (`losses.regularization`); the last stage (given `loss`): `fn(h, y, weight,
    loss_weight=weight) -> (loss x loss_weight + its regularization x weight, the same scaled for the
    tape)` (`loss_weight`: the microbatch's share of the batch's real labels, `losses.Loss.weights`,
    where it differs from its share of the examples). With `keep` (a
    model that `layer_by_layer` allows), each result ends with the list of every layer's output."""
    if loss is None:

        def body(h, weight):
            out, outputs = _model(stage, h, keep)
            reg = losses.regularization(stage.model)
            result = (out, None, None) if reg is None else (out, reg * weight, _scaled(stage, reg * weight))
            return result + (outputs,) if keep else result

        return body

    def fn(h, y, weight, loss_weight=None):
        out, outputs = _model(stage, h, keep)
        value = loss(y, out)
        reg = losses.regularization(stage.model)
        if loss_weight is None:
            value = (value if reg is None else value + reg) * weight
        else:
            value = value * loss_weight if reg is None else value * loss_weight + reg * weight
        result = (value, _scaled(stage, value))
        return result + (outputs,) if keep else result

    return fn


def _scaled(stage: Stage, value: tf.Tensor) -> tf.Tensor:
    """`value` as the tape differentiates it: times the stage's loss scale under float16."""
    return value if stage.loss_scale is None else stage.loss_scale.scale_loss(value)
