"""The training step: one `tf.function` that holds every stage's work.

For each stage, the input copy, forward pass, tape, gradient and optimizer update sit
inside `with tf.device(stage.device)`. Data crosses devices only through `copy_to`,
an identity op placed on the destination device, so the graph states every transfer.
Because the whole step is one dataflow graph, stages on different devices run
concurrently wherever their inputs allow.
"""

from __future__ import annotations

from typing import Callable, Sequence

import tensorflow as tf

from chain.data import Target
from chain.stages import Stage

COPY_PREFIX = "copy_to_"


def copy_to(tensor: tf.Tensor, device: str, what: str) -> tf.Tensor:
    """Copy `tensor` onto `device`: the only way data moves between stages' devices."""
    with tf.device(device):
        return tf.identity(tensor, name=f"{COPY_PREFIX}{what}")


def loss_fn(target: Target, y: tf.Tensor, pred: tf.Tensor) -> tf.Tensor:
    """Mean loss over the batch: cross-entropy from logits for classes, MSE for values."""
    pred = tf.cast(pred, tf.float32)
    if target.is_regression:
        return tf.reduce_mean(tf.square(tf.reshape(pred, [-1]) - tf.cast(y, tf.float32)))
    return tf.reduce_mean(tf.keras.losses.sparse_categorical_crossentropy(y, pred, from_logits=True))


def apply_update(stage: Stage, grads: Sequence[tf.Tensor]) -> None:
    """Apply one update of `stage`'s optimizer (call inside the stage's device scope).

    Every mode applies its updates through here, so numerics guards and loss scaling
    live in one place.
    """
    stage.optimizer.apply_gradients(zip(grads, stage.trainable_variables))


def local_step(stages: Sequence[Stage]) -> Callable:
    """mode=local: every stage learns its own target from the previous stage's output.

    The output that feeds stage k+1 is the body's, with the gradient stopped: stages
    never wait on each other's backward pass.
    """

    @tf.function
    def step(x: tf.Tensor, ys: dict[str, tf.Tensor]) -> dict[str, tf.Tensor]:
        h = x
        losses = {}
        for s in stages:
            h = copy_to(h, s.device, f"stage_{s.index}")
            y = copy_to(ys[s.target.name], s.device, f"stage_{s.index}_target")
            with tf.device(s.device):
                with tf.GradientTape() as tape:
                    out = s.model(h, training=True)
                    loss = loss_fn(s.target, y, s.head(out, training=True))
                grads = tape.gradient(loss, s.trainable_variables)
                apply_update(s, grads)
                h = tf.stop_gradient(out)
            losses[f"stage_{s.index}"] = loss
        return losses

    return step


def make_step(settings: dict, stages: Sequence[Stage], schedule=None) -> Callable:
    """The compiled training step for the configured mode.

    mode=e2e runs `schedule` (a `chain.schedules.Schedule`; default: the one
    `pipeline.schedule` and `pipeline.microbatches` name) and returns `{"loss": ...}`;
    mode=local returns one loss per stage, `{"stage_K": ...}`.
    """
    if settings["mode"] == "local":
        return local_step(stages)
    if settings["mode"] == "e2e":
        from chain import pipeline, schedules  # pipeline imports this module

        if schedule is None:
            p = settings["pipeline"]
            schedule = schedules.build(p["schedule"], len(stages), p["microbatches"])
        return pipeline.make_e2e_step(settings, stages, schedule, stages[-1].target)
    raise NotImplementedError(f"mode={settings['mode']}")
