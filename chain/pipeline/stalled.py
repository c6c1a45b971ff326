"""Where a stalled pipeline step waits, from the markers the step leaves (`chain.pipeline.progress`).

Each device of a running step records how many of its actions it has finished (its row of the
schedule, over every round of `trainer.grad_accum`); `where` turns those counts into the step's
schedule grid with each device's next action marked (`>B0`) and one line per device: the last
action it finished and the one it waits in, by the names the step gives their ops
(`Action.scope`, as the measured timeline reads them), with what that action waits for: another
device's action, or nothing (every input is there: the wait is inside the action itself).

This module imports no TensorFlow.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from chain.schedule.schedules import Action, Schedule, Timeline, dependencies, is_split, rounds, rows, simulate


ANSWER_S = 10.0  # how long a stall report waits for a device row's marker (`Progress.read`)


@dataclass(frozen=True)
class Position:
    """A running step's progress as its markers show it: how many steps this process's step function
    has begun (`started`), and per device row (copy 0's rows, then copy 1's, ...) how many of the row's
    actions step `started` has finished, over all its rounds (None: its marker did not answer)."""

    started: int
    finished: tuple[int | None, ...]


def row_actions(schedule: Schedule, row: int, grad_accum: int, replica: int = 0) -> list[Action]:
    """Device `row`'s actions in one step, in the order it runs them: its row of the schedule once
    per round (`rounds`: microbatches numbered over all rounds), in copy `replica`."""
    return rounds(schedule.actions[row], schedule.microbatches, grad_accum, replica)


def stride(schedule: Schedule, grad_accum: int) -> int:
    """What a marker's value counts steps in: more than any row's actions per step."""
    return max(len(r) for r in schedule.actions) * grad_accum + 1


def decode(started: int, values: Sequence[int | None], schedule: Schedule, grad_accum: int) -> Position:
    """The `Position` of step `started` from the markers' raw values (`step * stride + finished`;
    a marker of an earlier step means its row has finished nothing of this one; None: not read)."""
    unit = stride(schedule, grad_accum)
    return Position(started, tuple(None if v is None else v % unit if v // unit == started else 0 for v in values))


def where(
    schedule: Schedule, grad_accum: int, devices: Sequence[str], position: Position, replicas: int = 1
) -> list[str]:
    """The grid of the step's schedule (one round; `>`: each device's next action) and a line per
    device: its last finished action and the one it waits in, with what that one waits for.
    `devices`: each stage's device, copy 0's stages first (`replicas` copies of the pipeline)."""
    per_copy = schedule.devices
    lines_of: list[list[Action]] = [
        row_actions(schedule, r, grad_accum, c) for c in range(replicas) for r in range(per_copy)
    ]
    finished = set()
    for actions, n in zip(lines_of, position.finished):
        finished.update(actions[: n or 0])
    split = is_split(schedule)
    grid = simulate(schedule).grid
    marked: list[Action | None] = []
    text = []
    for i, (actions, n) in enumerate(zip(lines_of, position.finished)):
        name = _row_name(schedule, i % per_copy, i // per_copy, replicas)
        if n is None:
            marked.append(None)
            text.append(
                f"{name}: its marker did not answer within {ANSWER_S:g} s (its process is stopped, or busy inside one op)"
            )
            continue
        last = f"finished {actions[n - 1].scope()}" if n else "finished nothing of this step yet"
        if n >= len(actions):
            marked.append(None)
            text.append(f"{name}: finished every action ({actions[-1].scope()} last)")
            continue
        nxt = actions[n]
        marked.append(Action(nxt.stage, nxt.microbatch % schedule.microbatches, nxt.kind))
        missing = [d for d in dependencies(nxt, schedule.stages, split) if d not in finished]
        where_ = f"{nxt.scope()}{_round(nxt, schedule, grad_accum)}"
        if missing:
            needs = ", ".join(
                f"{d.scope()} ({_row_name(schedule, schedule.row(d.stage), d.replica, replicas, ':')})" for d in missing
            )
            text.append(f"{name}: {last}; waits in {where_} for {needs}")
        else:
            text.append(f"{name}: {last}; in {where_}, which has every input: the wait is inside it")
    copies = Timeline(tuple(grid) * replicas)
    return rows(copies, devices, schedule, replicas, marked) + text


def _round(action: Action, schedule: Schedule, grad_accum: int) -> str:
    """` (round r of N)` under gradient accumulation (the grid shows one round), else nothing."""
    return f" (round {action.microbatch // schedule.microbatches + 1} of {grad_accum})" if grad_accum > 1 else ""


def _row_name(schedule: Schedule, row: int, replica: int, replicas: int, inside: str = "") -> str:
    """A device row as the report names it: `stage 1`, `device 0 (stages 0, 2)`, `copy 1 stage 0`;
    `inside=":"`: `device 0: stages 0, 2`, for inside parentheses."""
    copy = f"copy {replica} " if replicas > 1 else ""
    if schedule.stage_rows:
        stages = ", ".join(map(str, schedule.row_stages(row)))
        return f"{copy}device {row}: stages {stages}" if inside else f"{copy}device {row} (stages {stages})"
    return f"{copy}stage {row}"
