"""The measured timeline (`timeline.json`): when each action of the schedule ran in the profiled
steps, per stage statistics and the balance advice (`chain.pipeline.timeline` makes them,
`chain.training.profile` writes them, the report reads them back).

An action here is stage, microbatch and kind, as `chain.schedule.schedules.Action` names one
(`MeasuredAction.key`); times are ms from the first profiled step's start.
"""

from __future__ import annotations

from dataclasses import dataclass

from chain.records.serial import item


@dataclass(frozen=True)
class MeasuredAction:
    """One action of one profiled step."""

    stage: int = item("the stage that ran it")
    microbatch: int = item("its microbatch (counting on across trainer.grad_accum rounds)")
    kind: str = item("F (forward), B (backward) or W (a split backward's weight gradients)")
    start_ms: float = item("its first op's start")
    end_ms: float = item("its last op's end")
    copy_ms: float = item("the transfer ops inside it")
    ops: int = item("the op events that made it")
    replica: int = item("the copy of the pipeline that ran it (placement.replicas; 0 without copies)", default=0)

    def key(self) -> tuple[int, int, str, int]:
        """(stage, microbatch, kind, replica): the fields of `chain.schedule.schedules.Action`."""
        return self.stage, self.microbatch, self.kind, self.replica or 0  # None: a timeline.json from before copies


@dataclass(frozen=True)
class MeasuredUpdate:
    """One stage's optimizer update in one profiled step."""

    stage: int = item("the stage")
    start_ms: float = item("its first op's start")
    end_ms: float = item("its last op's end")
    replica: int = item("the copy of the pipeline (placement.replicas; 0 without copies)", default=0)


@dataclass(frozen=True)
class MeasuredStep:
    """One profiled step."""

    step: int = item("the step's number")
    start_ms: float = item("its marker's start")
    end_ms: float = item("its marker's end")
    complete: bool = item(
        "whether the step counts in the statistics: every action of the schedule had an op, each trace read "
        "holds it whole, and its call did not first compile the step function"
    )
    actions: list[MeasuredAction] = item("its actions, by stage then start")
    updates: list[MeasuredUpdate] = item("its stages' updates")


@dataclass
class StageTime:
    """One stage's times, means per complete profiled step."""

    stage: int = item("the stage")
    device: str = item("its device")
    busy_ms: float = item("the time any of its actions ran")
    forward_ms: float = item("its forwards")
    backward_ms: float = item("its backwards")
    copy_ms: float = item("the transfer ops inside its actions")
    copy_wait_ms: float = item("idle time after its next input was ready on another device")
    update_ms: float = item("its update")
    busy_fraction: float | None = item("busy_ms over the step's span", default=None)
    replica: int = item("the copy of the pipeline (placement.replicas; 0 without copies)", default=0)


@dataclass
class Advice:
    """Which stage holds the pipeline back and the split of layers that evens it."""

    stage: int = item("the busiest stage")
    busy_ms: float = item("its busy time per step")
    mean_ms: float = item("the stages' mean busy time")
    excess: float = item("how much busier than the mean it is (0.8: 80%)")
    layers: list[int] = item("layers per stage now")
    split: list[int] = item("layers per stage advised")
    predicted_ms: list[float] = item("each stage's busy time predicted for the split")
    moves: list[int] = item("layers each stage gains (or loses)")
    fixed_cuts: list[int] = item("cuts kept where the kind of layer changes")
    constrained: bool = item("whether only changing the network would even the stages more")
    override: str | None = item("the override that sets the split (null: none)", default=None)
    text: str | None = item("the advice in one line", default=None)


@dataclass
class MeasuredTimeline:
    """timeline.json: the profiled steps of one run and what they measured."""

    schedule: str = item("the schedule's name")
    stages: int = item("its stages")
    microbatches: int = item("its microbatches")
    grad_accum: int = item("trainer.grad_accum (rounds of the schedule per step)")
    devices: list[str] = item("each stage's device (with copies of the pipeline: copy 0's stages, then copy 1's, ...)")
    steps: list[MeasuredStep] = item("every profiled step")
    planned_bubble_fraction: float = item("the plan's bubble fraction (unit-time actions)")
    measured_bubble_fraction: float | None = item("idle device time over devices x span (null: no complete step)")
    per_stage: list[StageTime] = item("each stage's times (with copies: copy 0's stages, then copy 1's, ...)")
    slowest_stage: int | None = item("the busiest stage (of copy 0)")
    step_ms: float | None = item("the mean span of a step, first action to last")
    trace: list[str] | None = item("the trace's directories, relative to the run directory", default=None)
    advice: Advice | None = item("the balance advice (null: balanced, or nothing measured)", default=None)
    shared_threads: bool | None = item("whether the stages were logical CPU devices of one process", default=None)
    replicas: int = item("copies of the pipeline (placement.replicas): every copy's actions are measured", default=1)
