"""Pipelined strategies: each stage on its own device, one `tf.function` per step.

`PipelinedLocal` (mode=local) runs every stage on its own head and loss, activations
passed forward (`chain.steps.local`). `PipelinedChain` (mode=e2e) runs the chain as one
network with a pipeline schedule over microbatches (`chain.pipeline.step`).
"""

from __future__ import annotations

import os
from typing import Any, Callable

from chain.config.checks import pipeline_schedule
from chain.config.schema import Settings
from chain.data.catalog import DataInfo
from chain.pipeline import schedules
from chain.pipeline.step import e2e_step
from chain.planning.planner import PIPELINE, Placement
from chain.steps.local import local_step
from chain.strategies.base import ChainObjective, LocalObjective, Strategy


class Pipelined(Strategy):
    """Stage k on `placement.devices[k]`; data crosses devices only through explicit copies."""

    name = PIPELINE


class PipelinedLocal(LocalObjective, Pipelined):
    """mode=local, pipelined: each stage learns from the previous stage's output, gradient stopped."""

    def make_step(self) -> Callable:
        t = self.settings.trainer
        return local_step(self.stages, t.grad_accum, t.jit_compile)


class PipelinedChain(ChainObjective, Pipelined):
    """mode=e2e, pipelined: `pipeline.schedule` over `pipeline.microbatches` per batch."""

    def __init__(self, settings: Settings, placement: Placement, info: DataInfo, **bodies: Any):
        self.schedule = pipeline_schedule(settings)  # a built-in one, or pipeline.schedule_file's
        super().__init__(settings, placement, info, **bodies)

    def make_step(self) -> Callable:
        t = self.settings.trainer
        return e2e_step(self.stages, self.schedule, self.loss_fn(), self.target, t.grad_accum, t.jit_compile)

    def batch_divisor(self) -> int:
        return self.settings.trainer.grad_accum * self.schedule.microbatches

    def parts(self) -> str | None:
        return self.cut_description() if self.batch_divisor() > 1 else None

    def cut_description(self) -> str:
        m, n = self.schedule.microbatches, self.settings.trainer.grad_accum
        if n == 1:
            return f"pipeline.microbatches={m} equal microbatches"
        return f"trainer.grad_accum={n} chunks of pipeline.microbatches={m} equal microbatches"

    def timeline(self) -> schedules.Timeline:
        """The schedule played with unit-time actions (its plan and bubble)."""
        return schedules.simulate(self.schedule)

    def summary(self) -> dict[str, Any]:
        out = {**super().summary(), "schedule": self.schedule.name, "microbatches": self.schedule.microbatches,
               "bubble_fraction": self.timeline().bubble_fraction}
        if self.schedule.name == schedules.FILE:
            out["schedule_file"] = os.path.abspath(self.settings.pipeline.schedule_file)
        if self.schedule.placement:  # interleaved: stage k on device k mod schedule_devices
            out["schedule_devices"] = self.schedule.devices
        return out

    def plan_text(self, full: bool) -> str:
        timeline = self.timeline()
        if full:
            return schedules.render(self.schedule, timeline, [s.device for s in self.stages])
        return (f"schedule: {self.schedule.name}, {self.schedule.microbatches} microbatches, "
                f"bubble fraction {timeline.bubble_fraction:.3f} (plan_only=true shows the timeline)")
