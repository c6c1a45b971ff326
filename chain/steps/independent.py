"""mode=side_by_side: independent models, each learning its target from the shared batch.

Model k takes the first `batch_sizes[k]` examples of every shared batch (its own slice),
copied onto its device; its body, head, loss, gradient and update run there. A paused
model computes nothing and reports a NaN loss. Nothing crosses between models.
"""

from __future__ import annotations

import math
from typing import Callable, Sequence

import tensorflow as tf

from chain.stages.stage import Stage
from chain.steps import xla
from chain.steps.local import local_forward
from chain.steps.ops import copy_to
from chain.steps.report import dropped, report
from chain.steps.update import stage_update, unscale


def model_pieces(s: Stage, batch_size: int, jit_compile: bool) -> tuple[Callable, Callable]:
    """(gradients(x, ys) -> (loss, grads), update(grads, loss) -> dropped) of model `s` on its slice."""
    forward = xla.stage_function(local_forward(s), jit_compile, xla.forward_name(s.index))
    update = stage_update(s, jit_compile)

    def gradients(x, ys):
        h = copy_to(x[:batch_size], s.device, f"model_{s.index}")
        y = copy_to(ys[s.target.name][:batch_size], s.device, f"model_{s.index}_target")
        with tf.device(s.device):
            with tf.GradientTape() as tape:
                _, loss, scaled = forward(h, y, 1.0)
            return loss, unscale(s, tape.gradient(scaled, s.trainable_variables))

    def apply(grads, loss):
        with tf.device(s.device):
            return update(grads, loss)

    return gradients, apply


def lockstep_step(
    stages: Sequence[Stage], batch_sizes: Sequence[int], paused: Sequence[bool], jit_compile: bool = False
) -> Callable:
    """Every active model takes one step on the shared batch, all in one traceable step:
    models on different devices run at once. Every update waits for every model's gradients,
    so a step that runs out of memory computing them has changed no model."""
    pieces = [None if p else model_pieces(s, b, jit_compile) for s, b, p in zip(stages, batch_sizes, paused)]

    def step(x: tf.Tensor, ys: dict[str, tf.Tensor]) -> tf.Tensor:
        computed = [None if p is None else p[0](x, ys) for p in pieces]
        gate = [g for c in computed if c is not None for g in c[1] + [c[0]] if g is not None]
        values = []
        for s, p, c in zip(stages, pieces, computed):
            if p is None:
                with tf.device(s.device):
                    values.append([tf.constant(math.nan), tf.constant(0.0)])
                continue
            loss, grads = c
            with tf.control_dependencies(gate):
                skip = p[1](grads, loss)
            with tf.device(s.device):
                values.append([loss, dropped(skip)])
        return report(stages, values, stages[-1].device)

    return step


def model_step(s: Stage, batch_size: int, jit_compile: bool = False) -> Callable:
    """One model's whole step (round_robin: models take turns): `fn(x, ys) -> [loss, skipped]`."""
    gradients, apply = model_pieces(s, batch_size, jit_compile)

    def step(x: tf.Tensor, ys: dict[str, tf.Tensor]) -> tf.Tensor:
        loss, grads = gradients(x, ys)
        with tf.device(s.device):
            return tf.stack([tf.cast(loss, tf.float32), dropped(apply(grads, loss))])

    return step
