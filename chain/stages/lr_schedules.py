"""Learning-rate schedules (`optim.schedule`): Keras' schedule classes over the optimizer's own step.

A schedule is called by Keras with the optimizer's `iterations` (the updates it has applied),
which every stage's checkpoint restores: a resumed run continues the schedule from the step it
stopped at, bit for bit. Each stage's optimizer applies one update per step (microbatches and
gradient accumulation are summed first), so every stage is at the same point of its schedule.

- `constant`: `optim.lr`, a plain float (Keras keeps it in a variable, as before schedules
  existed) unless there is a warm-up;
- `warmup_cosine`: Keras' `CosineDecay` with its own linear warm-up (`warmup_target`,
  `warmup_steps`) and `alpha` as the floor;
- `warmup_linear`: the same warm-up, then Keras' `PolynomialDecay` of power 1 to the floor.

The warm-up is Keras' formula, `lr x s / warmup_steps` at step s (so step 0's update is made
with a learning rate of 0, as `keras.optimizers.schedules.CosineDecay` does).
"""

from __future__ import annotations

import keras

from typing import Callable, Sequence

from chain.config.schema import Recipe
from chain.stages.savable import Warmup


def learning_rate(spec: Recipe) -> float | keras.optimizers.schedules.LearningRateSchedule:
    """What a Keras optimizer's `learning_rate` is for `spec` (its `decay_steps` settled by
    `chain.config.checks.settle_schedules`)."""
    lr, warm = spec.lr, spec.warmup_steps
    if spec.schedule == "constant":
        return lr if warm == 0 else Warmup(lr, warm)
    decay = spec.decay_steps - warm
    if spec.schedule == "warmup_cosine":
        return keras.optimizers.schedules.CosineDecay(0.0, decay, alpha=spec.floor, warmup_target=lr, warmup_steps=warm)
    linear = keras.optimizers.schedules.PolynomialDecay(lr, decay, end_learning_rate=lr * spec.floor, power=1.0)
    return Warmup(lr, warm, linear)


def scheduled(optimizer: keras.optimizers.Optimizer) -> bool:
    """Whether `optimizer`'s learning rate follows a schedule (a resume then leaves it alone: the
    restored step count sets it), rather than a variable a resume may set (`optim.lr`)."""
    return not isinstance(optimizer.learning_rate, keras.Variable)


def rates(specs: Sequence[Recipe]) -> Callable[[int], list[float]] | None:
    """For the logs: `fn(update)`, each stage's learning rate at its optimizer's update `update`
    (0 is the first step's), or None when no stage's learning rate changes over the steps."""
    if all(s.schedule == "constant" and s.warmup_steps == 0 for s in specs):
        return None
    made = [learning_rate(s) for s in specs]
    return lambda update: [float(m(update)) if callable(m) else m for m in made]
