"""`Scheduled`: the distribution that runs a pipeline schedule, a device per stage.

Given the chain's objective (`chain.strategies.objectives.ChainObjective`, mode=e2e) it runs the
schedule the preparation pass built (`RunSpec.schedule`), compiles the step that runs it
(`chain.pipeline.play`), and says what the plan looks like (`plan_only=true`) and what
summary.json records of it. Its stages live where `chain.strategies.device_per_stage.DevicePerStage`'s do
(stage k on `placement.devices[k]`); the objective is the one `chain.strategies.mirrored.Mirrored`
is given for mode=e2e.
"""

from __future__ import annotations

import os
from dataclasses import replace
from typing import Any, Callable

from chain.config.checks import BatchCut
from chain.config.schema import Settings
from chain.data.catalog import DataInfo
from chain.errors import plural
from chain.schedule import schedules
from chain.pipeline import stalled
from chain.pipeline.progress import Progress
from chain.pipeline.play import e2e_step, host, row_hosts
from chain.planning.planner import PIPELINE, Assignment
from chain.records.summaries import PipelineFields, Summary
from chain.stages.stage import Stage
from chain.strategies.base import Strategy
from chain.strategies.objectives import ChainObjective


class Scheduled(Strategy):
    """A device per stage, `pipeline.schedule` over `pipeline.microbatches` per batch, one loss."""

    name = PIPELINE
    title = "Scheduled"  # with the chain's objective: ScheduledChain
    shared_weights = True  # the step sums a tied weight's copies' gradients (`chain.steps.tied`)
    weighs_added_losses = True  # `chain.steps.forward` weighs each microbatch's `model.losses` by its share
    objective: ChainObjective  # a schedule's step learns the chain's one loss

    def __init__(
        self,
        settings: Settings,
        assignment: Assignment,
        info: DataInfo,
        batch_cut: BatchCut,
        learns: type[ChainObjective],
        schedule: schedules.Schedule,
        **bodies: Any,
    ):
        self.schedule = schedule  # the run's, built once by the preparation pass (`RunSpec.schedule`)
        super().__init__(settings, assignment, info, batch_cut, learns, **bodies)

    @property
    def clip_global_norm(self) -> float | None:
        """`optim.clip_global_norm` (the objective's): the step clips by the global norm and reports it."""
        return self.objective.clip_global_norm

    @property
    def target(self):
        """The chain's target (the objective's), which the last stage's read-out learns."""
        return self.objective.target

    def loss_fn(self) -> Callable:
        """`fn(y, pred)`: the chain's mean loss (the objective's), as the step computes it."""
        return self.objective.loss_fn()

    def make_step(self) -> Callable:
        t = self.settings.trainer
        self.progress = self.markers([self.stages])
        return e2e_step(
            self.stages,
            self.schedule,
            self.loss_fn(),
            self.target,
            t.grad_accum,
            t.jit_compile,
            clip_global_norm=self.clip_global_norm,
            batch_norm=self.settings.pipeline.batch_norm,
            recompute_policy=self.settings.pipeline.recompute,
            progress=self.progress,
            batch_cut=self.batch_cut,
        )

    def markers(self, copies: list[list[Stage]]) -> Progress | None:
        """The step's progress markers when `trainer.stall_s` watches it (`chain.pipeline.progress`), else None:
        a row per device row of each of `copies` (the pipeline's stages, per copy), kept by its device's process."""
        t = self.settings.trainer
        if not t.stall_s:
            return None
        return Progress(self.schedule, t.grad_accum, host(), row_hosts(self.schedule, copies))

    def position(self) -> stalled.Position | None:
        return self.progress.read() if self.progress is not None else None

    def steps_begun(self) -> int | None:
        return self.progress.begun() if self.progress is not None else None

    def waiting(self, position: stalled.Position) -> list[str]:
        return stalled.where(self.schedule, self.settings.trainer.grad_accum, [s.device for s in self.stages], position)

    def parts(self) -> str | None:
        # Copies of the pipeline do not count (each computes its share's terms whole, as Keras per replica).
        if self.settings.trainer.grad_accum * self.batch_cut.microbatches == 1:
            return None
        return Scheduled.cut_description(self)

    def cut_description(self) -> str:
        m, n = self.batch_cut.microbatches, self.settings.trainer.grad_accum
        if n == 1:
            return f"pipeline.microbatches={m} equal microbatches"
        return f"trainer.grad_accum={n} chunks of pipeline.microbatches={m} equal microbatches"

    def timeline(self) -> schedules.Timeline:
        """The schedule played with unit-time actions (its plan and bubble)."""
        return schedules.simulate(self.schedule)

    def summary(self, summary: Summary) -> Summary:
        path = self.settings.pipeline.schedule_file
        pipeline = PipelineFields(
            self.schedule.name,
            self.schedule.microbatches,
            self.timeline().bubble_fraction,
            self.settings.pipeline.recompute,
            os.path.abspath(path) if self.schedule.name == schedules.FILE else None,
            self.schedule.devices if self.schedule.stage_rows else None,
        )
        return replace(super().summary(summary), pipeline=pipeline)

    def plan_text(self, full: bool) -> str:
        timeline = self.timeline()
        if full:
            return schedules.render(self.schedule, timeline, [s.device for s in self.stages])
        recompute = self.settings.pipeline.recompute
        return (
            f"schedule: {self.schedule.name}, {plural(self.schedule.microbatches, 'microbatch')}, "
            f"bubble fraction {timeline.bubble_fraction:.3f} (plan_only=true shows the timeline)"
            + ("" if recompute == "never" else f"; recompute={recompute}")
        )
