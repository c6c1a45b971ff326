"""The numerics guard: an update whose loss or gradients hold a NaN or Inf is never applied.

The guard sits inside the compiled step (`chain.steps.update.apply_update` calls `guarded_update`),
so a bad update changes neither the weights nor the optimizer's moments or iteration
count; it only adds one to the stage's `skipped` counter. Each step also reports, per
stage, whether its update was dropped (in the step's report, `chain.steps.report`,
which the host reads once per step or once per call of N steps); `judge` then either
stops (`trainer.on_nan=stop`) or carries on (`skip`). Every mode applies its updates
through `apply_update`, so every mode is guarded.

The verdict is one fused reduction (`all_finite`: a sum per tensor, one check of their total), or,
with `optim.clip_global_norm` in mode=e2e, the clip factor the step computes anyway from the global
norm (`chain.steps.clipping.Clipped.finite`): no second pass over the gradients. Either way every
update waits for it; with the fused Adam kernel (the default) that wait is cheap
(docs/benchmarks-in-code.md).

Under float16 loss scaling (`chain.stages.loss_scale`) a step whose gradients overflow while
the loss is finite is the loss scale's business: it is skipped and counted there, and
never reaches this guard, so `on_nan=stop` stops on genuinely non-finite numbers only.
"""

from __future__ import annotations

import math
from typing import Callable, Sequence

import tensorflow as tf

from chain.errors import ChainError


class NonFiniteError(ChainError):
    """Training stopped because a stage's loss or gradients were not finite."""

    exit_code = 3  # distinct from bad input (2): the run started and then failed

    def __init__(self, stages: Sequence[int], step: int, detail: str = ""):
        self.stages = list(stages)
        self.step = step
        names = ", ".join(f"stage {k}" for k in self.stages)
        super().__init__(
            f"{names}: loss or gradients are not finite at step {step}; "
            f"that update was not applied (trainer.on_nan=stop){detail}"
        )


def all_finite(loss: tf.Tensor | None, grads: Sequence[tf.Tensor | None]) -> tf.Tensor:
    """A scalar bool: True when `loss` and every gradient hold only finite numbers.

    One sum per tensor and one check of their total: NaN and Inf propagate through sums
    (no finite result ever comes from a NaN or Inf operand), so the total is finite only
    if every element is. This reads each gradient once and puts one op per tensor, not two
    (`is_finite`, then `reduce_all`), between the last gradient and the update, which
    waits for the verdict (scripts/bench_overhead.py measured the cost). The one
    difference from an elementwise check: finite values whose float32 sum overflows
    (elements near 3.4e38 / size) also count as not finite; gradients that large already
    overflow Adam's second moment (g^2 passes 3.4e38 from |g| ~ 1.8e19).
    """
    # An embedding's sparse gradient: its rows (a table-sized dense copy only to check them would cost)
    sums = [
        tf.reduce_sum(tf.cast(g.values if isinstance(g, tf.IndexedSlices) else g, tf.float32))
        for g in grads
        if g is not None
    ]
    if loss is not None:
        sums.append(tf.reduce_sum(tf.cast(loss, tf.float32)))
    if not sums:
        return tf.constant(True)
    return tf.math.is_finite(sums[0] if len(sums) == 1 else tf.add_n(sums))


def guarded_update(skipped: tf.Variable, finite: tf.Tensor, apply: Callable[[], None]) -> tf.Tensor:
    """Run `apply()` only if `finite` (the update's loss and gradients are finite: `all_finite`);
    otherwise count one skip.

    A `tf.cond`, not a masked update: the optimizer must not even see the step, or
    its moments and iteration count would move. Returns whether the update was dropped.
    """

    def skip() -> None:
        skipped.assign_add(1)

    tf.cond(finite, apply, skip)
    return tf.logical_not(finite)


def judge(step: int, skipped: Sequence[int], on_nan: str) -> list[int]:
    """`skipped` (the stages whose update the guard dropped at `step`, from the step's
    report), or NonFiniteError naming them under `on_nan=stop`."""
    if skipped and on_nan == "stop":
        raise NonFiniteError(skipped, step)
    return list(skipped)


def finite_or_none(x: float | None) -> float | None:
    """A float for JSON: NaN and Inf become None (JSON has no spelling for them)."""
    return x if x is not None and math.isfinite(x) else None
