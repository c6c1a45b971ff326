"""Following a run's evaluations on the validation set: the best one so far (what
`checkpoint.best` keeps), early stopping (`trainer.early_stop_patience`), and how an
evaluation is shown (the log line, TensorBoard's `val_*` scalars).

The tracker's state goes into every checkpoint (`Tracker.state`, in `checkpoint.json`), so
a resumed run continues from the evaluations the interrupted one had made: it stops at the
same step and names the same best step as a run that was never interrupted.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from chain.strategies.objectives import Evaluation


@dataclass
class Tracker:
    """The best validation loss so far, its step, and how many evaluations have not improved
    on it since; `patience` (None: never stop) evaluations without improvement stop the run."""

    patience: int | None = None
    best_loss: float | None = None
    best_step: int | None = None
    evals_since_best: int = 0
    last_step: int = 0  # the step of the last evaluation counted

    def record(self, step: int, loss: float) -> bool:
        """Count the evaluation at `step`; True when its loss is the lowest so far.

        An evaluation at a step already counted (a finished run resumed and evaluated at its
        end again) changes nothing; a loss that is not finite never improves.
        """
        if step <= self.last_step:
            return False
        self.last_step = step
        if math.isfinite(loss) and (self.best_loss is None or loss < self.best_loss):
            self.best_loss, self.best_step, self.evals_since_best = loss, step, 0
            return True
        self.evals_since_best += 1
        return False

    @property
    def exhausted(self) -> bool:
        """True when the run should stop early: `patience` evaluations without improvement."""
        return self.patience is not None and self.evals_since_best >= self.patience

    def state(self) -> dict[str, Any]:
        """What a checkpoint records (`checkpoint.json`'s `validation`)."""
        return {
            "best_loss": self.best_loss,
            "best_step": self.best_step,
            "evals_since_best": self.evals_since_best,
            "last_step": self.last_step,
        }

    def restore(self, state: dict[str, Any] | None) -> None:
        """Continue from a checkpoint's `state()` (None: no evaluation had been counted)."""
        state = state or {}
        self.best_loss, self.best_step = state.get("best_loss"), state.get("best_step")
        self.evals_since_best, self.last_step = state.get("evals_since_best", 0), state.get("last_step", 0)


METRICS = ("accuracy", "mae", "perplexity", "bits_per_token")  # the last two: per-token losses


def entries(ev: Evaluation) -> list[dict[str, float]]:
    """The evaluation's metric sets: one per stage (mode=local) or the chain's (mode=e2e)."""
    return ev.stages or [ev.chain]


def line(ev: Evaluation) -> str:
    """The log text, e.g. `val_loss 0.1523  0.1011  val_accuracy 0.9611  0.9722` (a `-` where a
    stage's target has the other metric)."""
    parts = ["val_loss " + "  ".join(f"{e['loss']:.4f}" for e in entries(ev))]
    for metric in METRICS:
        values = [f"{e[metric]:.4f}" if metric in e else "-" for e in entries(ev)]
        if any(v != "-" for v in values):
            parts.append(f"val_{metric} " + "  ".join(values))
    return "  ".join(parts)


def scalars(ev: Evaluation) -> tuple[list[dict[str, float]], dict[str, float]]:
    """TensorBoard scalars: `val_loss`, `val_accuracy` | `val_mae` for each stage's writer
    (mode=local) and for the chain's (mode=e2e)."""

    def prefixed(m: dict[str, float] | None) -> dict[str, float]:
        return {f"val_{k}": v for k, v in (m or {}).items()}

    return [prefixed(m) for m in ev.stages], prefixed(ev.chain)
