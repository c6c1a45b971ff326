"""Where a measured pipeline step idles, by cause: what fills the gap between the planned bubble
(unit-time actions) and the measured one (`timeline.json`, `chain.pipeline.timeline`).

Each device's idle time within a step's span (first action to last) splits into:

- **input wait**: the device's previous action had ended and the next action of its row still
  lacked an input: a producer on another device (or its own F, for a W or B) had not finished. This
  is the schedule's own bubble, as the actions' real durations play it.
- **overhead**: the next action's inputs existed and the previous action had ended, yet the action
  had not started: what the step adds to the schedule (the host release's round trip after a
  sending action, a transfer between workers, an op that waits on the client).
- **tail**: after the device's last action, until the step's last action ended.

`step_and_bubble` plays the schedule again with each (stage, kind)'s mean measured duration and nothing
else (no transfer, no release): the bubble the schedule has with these actions' costs, between the
plan's unit-time figure and the measured one. With F, B and W of unequal cost (on a CPU, a layer's
forward product may take twice its input-gradient product) a zero-bubble schedule's own bubble is
well above its unit-time plan, and no removal of overhead closes that part.

Outside the span: **head** (the step's marker to its first action: dispatching the step to the
workers, the batch reaching the first stage) and **finish** (its last action to the marker's end:
the updates, the report back to the client). Every schedule pays both alike.

No TensorFlow here: it reads the records `chain.pipeline.timeline.measure` wrote.
"""

from __future__ import annotations

from dataclasses import dataclass
from statistics import fmean, median
from typing import Sequence

from chain.schedule.schedules import Action, Schedule, dependencies, is_split, play_timed, rounds
from chain.records.measured import MeasuredTimeline, MeasuredAction, MeasuredStep


@dataclass(frozen=True)
class DeviceIdle:
    """One device's time in a step (ms, median over the complete steps), by cause (module docstring)."""

    device: int
    busy_ms: float
    input_wait_ms: float
    overhead_ms: float
    tail_ms: float


@dataclass(frozen=True)
class StepIdle:
    """A measured timeline's step, by cause: per device (`devices`), the step's head and finish outside
    its span, the span, and the bubble the schedule has when played with the measured mean durations."""

    devices: list[DeviceIdle]
    head_ms: float
    span_ms: float
    finish_ms: float
    replayed_span_ms: float
    replayed_bubble_fraction: float


def played_rows(schedule: Schedule, grad_accum: int = 1) -> list[list[Action]]:
    """Each device's actions in the order the step plays them: `grad_accum` rounds of its row."""
    return [rounds(row, schedule.microbatches, grad_accum) for row in schedule.actions]


def step_idle(step: MeasuredStep, rows: Sequence[Sequence[Action]], schedule: Schedule) -> list[DeviceIdle]:
    """Per device, `step`'s busy time and idle time by cause (copy 0 of a replicated pipeline only)."""
    by = {a.key()[:3]: a for a in step.actions if (a.replica or 0) == 0}
    split = is_split(schedule)
    first = min(a.start_ms for a in by.values())
    last = max(a.end_ms for a in by.values())
    out = []
    for r, row in enumerate(rows):
        busy = input_wait = overhead = 0.0
        previous = first
        for action in row:
            measured: MeasuredAction | None = by.get((action.stage, action.microbatch, action.kind))
            if measured is None:  # a W without ops (`chain.pipeline.timeline.measure`): no time of its own
                continue
            inputs = max(
                (
                    by[key].end_ms
                    for d in dependencies(action, schedule.stages, split)
                    if (key := (d.stage, d.microbatch, d.kind)) in by
                ),
                default=first,
            )
            ready = max(previous, inputs)
            input_wait += max(0.0, min(inputs, measured.start_ms) - previous)
            overhead += max(0.0, measured.start_ms - ready)
            busy += max(0.0, measured.end_ms - max(measured.start_ms, previous))
            previous = max(previous, measured.end_ms)
        out.append(DeviceIdle(r, busy, input_wait, overhead, max(0.0, last - previous)))
    return out


def step_and_bubble(
    schedule: Schedule, durations: dict[tuple[int, str], float], grad_accum: int = 1
) -> tuple[float, float]:
    """(span, bubble fraction) of `schedule` played (`play_timed`) with `durations[(stage, kind)]` per
    action (0 for a kind never measured: a W without ops) and nothing between actions: each starts when its row's
    previous action and its inputs have ended."""
    timed = play_timed(schedule, lambda a: durations.get((a.stage, a.kind), 0.0), grad_accum=grad_accum)
    return timed.span, timed.bubble_fraction


def mean_durations(steps: Sequence[MeasuredStep]) -> dict[tuple[int, str], float]:
    """Each (stage, kind)'s mean action duration over `steps` (copy 0)."""
    acc: dict[tuple[int, str], list[float]] = {}
    for s in steps:
        for a in s.actions:
            if (a.replica or 0) == 0:
                acc.setdefault((a.stage, a.kind), []).append(a.end_ms - a.start_ms)
    return {k: fmean(v) for k, v in acc.items()}


def explain(measured: MeasuredTimeline, schedule: Schedule) -> StepIdle | None:
    """`measured`'s complete steps by cause, medians over them (a step slowed by another process moves
    a median less than a mean), and the schedule played with the mean durations (None: no complete step)."""
    steps = [s for s in measured.steps if s.complete]
    if not steps:
        return None
    rows = played_rows(schedule, measured.grad_accum)
    per = [step_idle(s, rows, schedule) for s in steps]
    devices = [
        DeviceIdle(
            r, *(median(getattr(p[r], f) for p in per) for f in ("busy_ms", "input_wait_ms", "overhead_ms", "tail_ms"))
        )
        for r in range(len(rows))
    ]
    spans = [(min(a.start_ms for a in s.actions), max(a.end_ms for a in s.actions), s) for s in steps]
    span, bubble = step_and_bubble(schedule, mean_durations(steps), measured.grad_accum)
    return StepIdle(
        devices,
        median(lo - s.start_ms for lo, _, s in spans),
        median(hi - lo for lo, hi, _ in spans),
        median(s.end_ms - hi for _, hi, s in spans),
        span,
        bubble,
    )


def render(idle: StepIdle) -> str:
    """`idle` as lines of text: one per device, then the step's head, span and finish, and the play on the mean durations."""
    lines = [
        f"device {d.device}: busy {d.busy_ms:.1f} ms, waiting for inputs {d.input_wait_ms:.1f}, "
        f"overhead {d.overhead_ms:.1f}, tail {d.tail_ms:.1f}"
        for d in idle.devices
    ]
    lines.append(
        f"step: head {idle.head_ms:.1f} ms, span {idle.span_ms:.1f}, finish {idle.finish_ms:.1f}; "
        f"played with the measured mean durations: span {idle.replayed_span_ms:.1f}, "
        f"bubble {idle.replayed_bubble_fraction:.3f}"
    )
    return "\n".join(lines)
