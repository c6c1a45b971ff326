"""`PipelinedChain`: mode=e2e on a device per stage, the strategy that runs a pipeline schedule.

It builds the schedule (`chain.pipeline.schedules`), compiles the step that runs it
(`chain.pipeline.step`), and says what the plan looks like (`plan_only=true`) and what
summary.json records of it. It shares the `Pipelined` distribution with `PipelinedLocal`
(`chain.strategies.pipelined`) and the chain's objective with `MirroredChain`
(`chain.strategies.base.ChainObjective`).
"""

from __future__ import annotations

from typing import Any, Callable

from chain.config.schema import Settings
from chain.data.catalog import DataInfo
from chain.pipeline import schedules
from chain.pipeline.step import e2e_step
from chain.planning.planner import Placement
from chain.strategies.base import ChainObjective
from chain.strategies.pipelined import Pipelined


class PipelinedChain(ChainObjective, Pipelined):
    """mode=e2e, pipelined: `pipeline.schedule` over `pipeline.microbatches` per batch."""

    def __init__(self, settings: Settings, placement: Placement, info: DataInfo, **bodies: Any):
        p = settings.pipeline
        self.schedule = schedules.build(p.schedule, len(settings.stages), p.microbatches)
        super().__init__(settings, placement, info, **bodies)

    def make_step(self) -> Callable:
        t = self.settings.trainer
        return e2e_step(self.stages, self.schedule, self.loss_fn(), self.target, t.grad_accum, t.jit_compile,
                        recompute_policy=self.settings.pipeline.recompute)

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
        return {**super().summary(), "schedule": self.schedule.name, "microbatches": self.schedule.microbatches,
                "bubble_fraction": self.timeline().bubble_fraction, "recompute": self.settings.pipeline.recompute}

    def plan_text(self, full: bool) -> str:
        timeline = self.timeline()
        if full:
            return schedules.render(self.schedule, timeline, [s.device for s in self.stages])
        recompute = self.settings.pipeline.recompute
        return (f"schedule: {self.schedule.name}, {self.schedule.microbatches} microbatches, "
                f"bubble fraction {timeline.bubble_fraction:.3f} (plan_only=true shows the timeline)"
                + ("" if recompute == "never" else f"; recompute={recompute}"))
