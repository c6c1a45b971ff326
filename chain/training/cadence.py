"""The training loop's cadences: which steps save a checkpoint, evaluate, log and are profiled,
and how many steps one call of the compiled step may run.

Each cadence answers "is step N due?" (`due`) and "how far may the call after step `done`
run?" (`limit`). `Cadences.call_length` asks them all: a call of up to
`trainer.steps_per_call` steps never runs past `trainer.steps`, a checkpoint or an
evaluation (each sees the state of its own step, and so do the test hooks after a
checkpoint), and inside the profiled window (`trainer.profile`) every step is a call of its
own, so each step has its own interval in the trace. Logging ends no call: its lines and
TensorBoard points are written after the call, from each step's losses. With
`placement.plan=auto` one more check is due once (`chain.autoplan.step_check.PlanCheck`): the measured step
against the plan's prediction, after its first timed steps.

Steps count from 1; `done` is the number of steps taken so far (`Run.global_step`: on
resume, the restored checkpoint's step), so a resumed run is due at the same steps as one
that was never interrupted.
"""

from __future__ import annotations

from dataclasses import dataclass

from chain.autoplan.step_check import PlanCheck
from chain.config.schema import Trainer


@dataclass(frozen=True)
class Every:
    """Due at every multiple of `period` steps; `period=0`: never (the cadence is off)."""

    period: int = 0

    def due(self, step: int) -> bool:
        """Whether step `step` is a multiple of the period."""
        return self.period > 0 and step % self.period == 0

    def limit(self, done: int, n: int) -> int:
        """At most `n` steps after step `done`, ending at the next due step at the latest."""
        return min(n, self.period - done % self.period) if self.period else n


@dataclass(frozen=True)
class Span:
    """Steps `start` to `stop`, both included, one step per call (`trainer.profile`: the traced steps)."""

    start: int
    stop: int

    def due(self, step: int) -> bool:
        """Whether step `step` is inside the span."""
        return self.start <= step <= self.stop

    def limit(self, done: int, n: int) -> int:
        """At most `n` steps after step `done`: a call before the span ends where the span starts,
        a call inside it runs one step."""
        if self.due(done + 1):
            return 1
        if done + 1 < self.start:
            return min(n, self.start - 1 - done)
        return n


@dataclass(frozen=True)
class Logging:
    """`trainer.log_every`: a log line at each multiple of `every`; a TensorBoard point there and
    at the first and the `last` step too (the curves always have both ends)."""

    every: int
    last: int

    def due(self, step: int) -> bool:
        """Whether step `step` writes a log line."""
        return step % self.every == 0

    def point(self, step: int) -> bool:
        """Whether step `step` writes its losses to TensorBoard."""
        return self.due(step) or step == 1 or step == self.last

    def limit(self, done: int, n: int) -> int:
        """Logging ends no call: the loop logs each step of a call after it returns."""
        return n


@dataclass(frozen=True)
class Cadences:
    """Every cadence of one run, and the call lengths they leave (`call_length`)."""

    steps: int  # trainer.steps: the last step
    per_call: int  # trainer.steps_per_call: the longest call
    checkpoint: Every
    evaluation: Every
    logging: Logging
    profile: Span | None = None
    plan: PlanCheck | None = None  # placement.plan=auto: ends no call

    @classmethod
    def of(cls, trainer: Trainer, checkpoint_every: int, predicted_ms: float | None = None) -> Cadences:
        """The cadences `trainer` sets; `checkpoint_every`: `checkpoint.every` when the run saves
        checkpoints (it has a directory), else 0; `predicted_ms`: plan=auto's predicted step (None:
        a plan by hand, nothing to check)."""
        return cls(
            steps=trainer.steps,
            per_call=trainer.steps_per_call,
            checkpoint=Every(checkpoint_every),
            evaluation=Every(trainer.eval_every),
            logging=Logging(trainer.log_every, trainer.steps),
            profile=Span(*trainer.profile) if trainer.profile else None,
            plan=PlanCheck(predicted_ms) if predicted_ms is not None else None,
        )

    def call_length(self, done: int) -> int:
        """How many steps the call after step `done` runs: up to `per_call`, never past `steps`,
        ending at the next checkpoint or evaluation, one at a time inside the profiled span."""
        n = min(self.per_call, self.steps - done)
        for cadence in (self.checkpoint, self.evaluation, self.logging, self.profile):
            if cadence is not None:
                n = cadence.limit(done, n)
        return n
