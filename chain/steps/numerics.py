"""The numerics guard: an update whose loss or gradients hold a NaN or Inf is never applied.

The guard sits inside the compiled step (`chain.steps.update.apply_update` calls `guarded_update`),
so a bad update changes neither the weights nor the optimizer's moments or iteration
count; it only adds one to the stage's `skipped` counter. After each step the Python
loop reads the counters (`Watch`) and either stops (`trainer.on_nan=stop`) or carries
on (`skip`). Every mode applies its updates through `apply_update`, so every mode is
guarded.

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
        super().__init__(f"{names}: loss or gradients are not finite at step {step}; "
                         f"that update was not applied (trainer.on_nan=stop){detail}")


def all_finite(loss: tf.Tensor | None, grads: Sequence[tf.Tensor | None]) -> tf.Tensor:
    """A scalar bool: True when `loss` and every gradient hold only finite numbers."""
    checks = [tf.reduce_all(tf.math.is_finite(g)) for g in grads if g is not None]
    if loss is not None:
        checks.append(tf.reduce_all(tf.math.is_finite(loss)))
    return tf.reduce_all(tf.stack(checks)) if checks else tf.constant(True)


def guarded_update(skipped: tf.Variable, loss: tf.Tensor | None, grads: Sequence[tf.Tensor | None],
                   apply: Callable[[], None]) -> tf.Tensor:
    """Run `apply()` only if `loss` and `grads` are finite; otherwise count one skip.

    A `tf.cond`, not a masked update: the optimizer must not even see the step, or
    its moments and iteration count would move. Returns the finite flag.
    """
    ok = all_finite(loss, grads)

    def skip() -> None:
        skipped.assign_add(1)

    tf.cond(ok, apply, skip)
    return ok


class Watch:
    """Reads every stage's `skipped` counter after a step to see which stages were guarded."""

    def __init__(self, stages: Sequence):
        self.stages = list(stages)
        self.sync()

    def sync(self) -> None:
        """Re-read the counters (after a restore)."""
        self.counts = [int(s.skipped.numpy()) for s in self.stages]

    def after_step(self, step: int, on_nan: str) -> list[int]:
        """Indices of stages whose update was dropped at `step`; raises under `on_nan=stop`."""
        now = [int(s.skipped.numpy()) for s in self.stages]
        bad = [s.index for s, a, b in zip(self.stages, self.counts, now) if b > a]
        self.counts = now
        if bad and on_nan == "stop":
            raise NonFiniteError(bad, step)
        return bad


def finite_or_none(x: float | None) -> float | None:
    """A float for JSON: NaN and Inf become None (JSON has no spelling for them)."""
    return x if x is not None and math.isfinite(x) else None
