"""The measured text grid: a profiled step's actions laid out as the plan's grid is
(`chain.schedule.schedules.rows`), a cell per action, so the two read line by line.

**Ticks, not time slots.** Every action of the step gets its own cell: the actions are placed
in the order they started, each in the first column (*tick*) that is right of its row's
previous action, right of its producer (`chain.pipeline.timeline.producer`), right of every
action that had ended before it started (on any row) and not left of any action that started
before it. So an action that started after another ended is to its right, two actions share a
column only if they ran at once, and a step that ran as planned (every action as long as the
others) gives the plan's grid. Equal time slots did not: an action much shorter than a slot
filled none and vanished.

A tick lasts from its column's first start to the next column's. An empty cell is `.` when
its row was idle for most of that tick, `-` when the row was still running an action to its
left (a long action spans several ticks of shorter ones elsewhere); a pause between a row's
actions shorter than `MEASURABLE` of the step's mean action counts as running. How long the
actions took is on the line below the grid (`durations`), not in the cells.

No TensorFlow.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from chain.errors import plural
from chain.pipeline.timeline import action, producer, row_of, shown
from chain.records.measured import MeasuredTimeline, MeasuredAction, MeasuredStep
from chain.schedule.schedules import KINDS, Action, Schedule, Timeline, rows, simulate

# A row's pause shorter than this share of the step's mean action is the host dispatching its next
# op, not a wait worth a cell (a cell stands for a whole action).
MEASURABLE = 0.05


@dataclass(frozen=True)
class MeasuredGrid:
    """A step's actions on ticks: `cells[row][tick]` (None: no action starts there) and, for an
    empty cell, whether its row was still running an action to its left (`running[row][tick]`);
    `starts_ms[tick]`: when the tick began (its column's first start)."""

    cells: tuple[tuple[Action | None, ...], ...]
    running: tuple[tuple[bool, ...], ...]
    starts_ms: tuple[float, ...]

    def timeline(self) -> Timeline:
        """The cells as a `Timeline`, comparable with the plan's (`simulate`)."""
        return Timeline(self.cells)


def _row(a: MeasuredAction, stages: int) -> int:
    """The grid's row of `a`: its stage in its copy of the pipeline (`row_of`)."""
    return row_of(a.stage, a.replica or 0, stages)  # None: a timeline.json from before copies


def ticks(actions: Sequence[MeasuredAction], stages: int) -> list[int]:
    """The column of each of `actions` (one step's), by the rules of this module's docstring."""
    order = sorted(range(len(actions)), key=lambda i: actions[i].start_ms)  # stable: a row's own order on ties
    column = [0] * len(actions)
    placed: dict[Action, int] = {}
    last: dict[int, int] = {}  # row -> the column of its latest action
    frontier = 0
    for n, i in enumerate(order):
        a = actions[i]
        row = _row(a, stages)
        mine = action(a)
        before = [column[j] + 1 for j in order[:n] if actions[j].end_ms <= a.start_ms]
        after = [last[row] + 1] if row in last else []
        p = producer(mine, stages)
        made = [placed[p] + 1] if p in placed else []
        column[i] = frontier = max([frontier, *before, *after, *made])
        placed[mine], last[row] = column[i], column[i]
    return column


def grid(measured: MeasuredTimeline, step: MeasuredStep) -> MeasuredGrid:
    """`step`'s actions on ticks (`ticks`), a row per stage of every copy (`row_of`)."""
    acts = step.actions
    n_rows = measured.stages * (measured.replicas or 1)
    column = ticks(acts, measured.stages)
    width = max(column) + 1
    starts = [min(a.start_ms for a, c in zip(acts, column) if c == t) for t in range(width)]
    ends = starts[1:] + [max(a.end_ms for a in acts)]
    cells: list[list[Action | None]] = [[None] * width for _ in range(n_rows)]
    running = [[False] * width for _ in range(n_rows)]
    for a, c in zip(acts, column):
        cells[_row(a, measured.stages)][c] = action(a)
    pause = MEASURABLE * sum(a.end_ms - a.start_ms for a in acts) / len(acts)
    for r in range(n_rows):
        busy = _merged([(a.start_ms, a.end_ms) for a in acts if _row(a, measured.stages) == r], pause)
        first = next((t for t in range(width) if cells[r][t] is not None), width)
        for t in range(first + 1, width):
            if cells[r][t] is None:
                running[r][t] = _mostly_busy(busy, starts[t], ends[t])
    return MeasuredGrid(tuple(map(tuple, cells)), tuple(map(tuple, running)), tuple(starts))


def _merged(intervals: Sequence[tuple[float, float]], pause: float) -> list[tuple[float, float]]:
    """The union of `intervals` as disjoint intervals, a gap shorter than `pause` closed."""
    out: list[list[float]] = []
    for lo, hi in sorted(intervals):
        if out and lo - out[-1][1] < pause:
            out[-1][1] = max(out[-1][1], hi)
        else:
            out.append([lo, hi])
    return [(lo, hi) for lo, hi in out]


def _mostly_busy(busy: Sequence[tuple[float, float]], lo: float, hi: float) -> bool:
    """Whether `busy` covers more than half of [lo, hi) (a tick of no length: whether it covers lo)."""
    if hi <= lo:
        return any(a <= lo < b for a, b in busy)
    return sum(max(0.0, min(b, hi) - max(a, lo)) for a, b in busy) > (hi - lo) / 2


def durations(measured: MeasuredTimeline, step: MeasuredStep) -> str:
    """Each row's mean action time in `step`, by kind: `stage 0 F 0.098 B 0.040; stage 1 ...` (ms)."""
    n_rows = measured.stages * (measured.replicas or 1)
    parts = []
    for r in range(n_rows):
        mine = [a for a in step.actions if _row(a, measured.stages) == r]
        means = [
            f"{kind} {sum(d) / len(d):.3f}"
            for kind in KINDS
            if (d := [a.end_ms - a.start_ms for a in mine if a.kind == kind])
        ]
        copy = f"copy {r // measured.stages} " if (measured.replicas or 1) > 1 else ""
        parts.append(f"{copy}stage {r % measured.stages} {' '.join(means)}")
    return "mean ms per action: " + "; ".join(parts)


def unmeasured(xla: bool) -> str:
    """Why a profiled run's timeline shows no step (`xla`: the run compiled its actions, `trainer.jit_compile`)."""
    if xla:
        # An XLA call's work shows in the trace as unnamed executable events and HLO ops, without the
        # action's name scope.
        return (
            "none under trainer.jit_compile=true: TensorFlow's trace does not name the ops of an XLA-compiled "
            "call, so no action can be placed (the trace is kept for TensorBoard); profile with "
            "trainer.jit_compile=false to measure the schedule"
        )
    return "no profiled step holds every action of the schedule"


def render(
    measured: MeasuredTimeline, schedule: Schedule, devices: Sequence[str] | None = None, xla: bool = False
) -> str:
    """The `shown` step as the plan's text grid, a cell per action on ticks (`grid`), then each
    row's mean action times and the measured and planned bubble; without one, why (`unmeasured`)."""
    step = shown(measured)
    if step is None:
        return f"measured timeline: {unmeasured(xla)}"
    done = [s for s in measured.steps if s.complete]
    laid = grid(measured, step)
    span = max(a.end_ms for a in step.actions) - min(a.start_ms for a in step.actions)
    lines = [
        f"measured: step {step.step}, {span:.2f} ms, {plural(len(laid.starts_ms), 'tick')} (a cell per action, "
        "in the order they started; -: still running, .: idle)"
    ]
    lines += rows(laid.timeline(), devices, replicas=measured.replicas or 1, running=laid.running)
    lines.append(durations(measured, step))
    lines.append(
        f"measured bubble fraction: {measured.measured_bubble_fraction:.3f} (idle time / all time, "
        f"mean of {plural(len(done), 'step')}); planned: {simulate(schedule).bubble_fraction:.3f}"
    )
    return "\n".join(lines)
