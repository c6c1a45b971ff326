"""One stage of the chain as the e2e steps call it: its forward pass, its regularization and,
on the last stage, the loss, each weighted and scaled for the tape (`chain.pipeline.step`
calls it per microbatch, `chain.steps.replica` per replica)."""

from __future__ import annotations

from typing import Callable

import tensorflow as tf

from chain.stages import losses
from chain.stages.stage import Stage


def chain_forward(stage: Stage, loss: Callable | None = None) -> Callable:
    """One stage of the chain. A stage before the last: `fn(h, weight) -> (output,
    regularization x weight, the same scaled for the tape)`, both None when the stage has no
    regularization (`losses.regularization`); the last stage (given `loss`): `fn(h, y, weight)
    -> ((loss + its regularization) x weight, the same scaled for the tape)`."""
    if loss is None:
        def body(h, weight):
            out = stage.model(h, training=True)
            reg = losses.regularization(stage.model)
            if reg is None:
                return out, None, None
            reg = reg * weight
            return out, reg, _scaled(stage, reg)

        return body

    def fn(h, y, weight):
        value = loss(y, stage.model(h, training=True))
        reg = losses.regularization(stage.model)
        value = (value if reg is None else value + reg) * weight
        return value, _scaled(stage, value)

    return fn


def _scaled(stage: Stage, value: tf.Tensor) -> tf.Tensor:
    """`value` as the tape differentiates it: times the stage's loss scale under float16."""
    return value if stage.loss_scale is None else stage.loss_scale.scale_loss(value)
