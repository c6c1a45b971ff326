"""Applying updates: every way of training applies each stage's update through `apply_update`,
so the numerics guard and float16 loss scaling live in one place."""

from __future__ import annotations

from typing import Callable, Sequence

import tensorflow as tf

from chain.stages import loss_scale
from chain.stages.stage import Stage
from chain.steps import xla
from chain.steps.numerics import all_finite, guarded_update
from chain.steps.ops import copy_to


def unscale(stage: Stage, grads: Sequence[tf.Tensor | None]) -> list[tf.Tensor | None]:
    """Gradients of a stage's scaled loss divided by its loss scale (precision=mixed_float16);
    unchanged otherwise."""
    return list(grads) if stage.loss_scale is None else stage.loss_scale.unscale(grads)


def apply_update(
    stage: Stage,
    grads: Sequence[tf.Tensor],
    loss: tf.Tensor | None = None,
    outcome: tuple[tf.Tensor, tf.Tensor] | None = None,
    finite: tf.Tensor | None = None,
) -> tf.Tensor:
    """Apply one update of `stage`'s optimizer (call inside the stage's device scope).

    `grads` are true (unscaled, see `unscale`) gradients. The update is applied only if
    `loss` (when given) and `grads` are finite (`chain.steps.numerics`). Under float16 loss
    scaling, `outcome` is the stage's share of its group's decision from `shared_outcomes`
    (a chain with one loss): the decision and this stage's gradients' finite flag, computed
    there once; without it the stage is a group of its own and decides from `loss` and
    `grads`. `finite` (without loss scaling): the verdict on `grads` when the step has one already
    (`chain.steps.clipping.Clipped.finite`: the global norm it clipped by is finite), so the guard
    makes no pass of its own over them. Returns whether the numerics guard dropped the update (what
    `skipped` counts): False on a float16 overflow, which the loss scale skips and counts itself.
    """
    variables = stage.trainable_variables

    def apply() -> None:
        if variables:  # a stage may hold none: a pooling piece, or a read-out whose tied weight it borrows
            stage.optimizer.apply_gradients(zip(grads, variables))

    if stage.loss_scale is None:
        if finite is None:
            return guarded_update(stage.skipped, all_finite(loss, grads), apply)
        return guarded_update(
            stage.skipped, finite if loss is None else tf.logical_and(finite, all_finite(loss, [])), apply
        )
    decided, grads_ok = (None, all_finite(None, grads)) if outcome is None else outcome
    loss_ok = loss_scale.loss_finite(loss)
    if decided is None:
        decided = loss_scale.outcome_of(loss_ok, [grads_ok], stage.loss_scale.scale)
    finite = grads_ok if loss is None else tf.logical_and(loss_ok, grads_ok)
    return stage.loss_scale.update(decided, lambda: guarded_update(stage.skipped, finite, apply))


def stage_update(stage: Stage, jit_compile: bool = False) -> Callable:
    """`fn(grads, loss=None, outcome=None, finite=None)`: `apply_update` for `stage`, compiled with XLA if asked."""

    def fn(grads, loss=None, outcome=None, finite=None):
        return apply_update(stage, grads, loss, outcome, finite)

    return xla.stage_function(fn, jit_compile, xla.update_name(stage.index))


def shared_outcomes(
    stages: Sequence[Stage], grads: Sequence[Sequence[tf.Tensor]], loss: tf.Tensor, device: str | None
) -> list[tuple[tf.Tensor, tf.Tensor] | None]:
    """One loss-scale outcome for stages that share one loss (mode=e2e), decided on `device`.

    Each stage's finite flag is computed on its device and copied to `device` (where
    the loss is); the outcome is copied back to every stage, so all of them apply, or
    all skip and halve their copy of the scale, which therefore stays the same on every
    stage. Each stage gets `(outcome, its finite flag)`: `apply_update`'s numerics guard
    reads the same flag. Without loss scaling: `[None] * len(stages)`.
    """
    if stages[-1].loss_scale is None:
        return [None] * len(stages)
    with tf.name_scope("loss_scale"):
        own, flags = [], []
        for s, g in zip(stages, grads):
            with tf.device(s.device):
                own.append(all_finite(None, g))
            flags.append(copy_to(own[-1], device, f"finite_s{s.index}"))
        with tf.device(device):
            outcome = loss_scale.decide(loss, flags, stages[-1].loss_scale.scale)
        return [(copy_to(outcome, s.device, f"outcome_s{s.index}"), f) for s, f in zip(stages, own)]
