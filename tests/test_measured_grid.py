"""The measured text grid (`chain.pipeline.measured_grid`) on constructed steps: every action has its
own cell, a row keeps its schedule's order, the order across devices is kept, and an empty cell is
idle only where its device waited."""

from __future__ import annotations

import random

from chain.pipeline import measured_grid, timeline
from chain.records.measured import MeasuredTimeline, MeasuredAction, MeasuredStep
from chain.schedule import schedules
from chain.schedule.schedules import Action


def act(text: str) -> Action:
    """`s1 F0`: stage 1's forward of microbatch 0."""
    return Action(int(text[1]), int(text[4:]), text[3])


def measured(schedule, times) -> MeasuredTimeline:
    """One complete step of `schedule` whose actions ran at `times` ({Action: (start_ms, end_ms)})."""
    acts = sorted(
        (MeasuredAction(a.stage, a.microbatch, a.kind, lo, hi, 0.0, 1) for a, (lo, hi) in times.items()),
        key=lambda a: (a.stage, a.start_ms),
    )
    step = MeasuredStep(1, 0.0, max(hi for _, hi in times.values()), True, acts, [])
    return MeasuredTimeline(
        schedule.name,
        schedule.stages,
        schedule.microbatches,
        1,
        [f"/d:{k}" for k in range(schedule.stages)],
        [step],
        0.0,
        0.0,
        [],
        None,
        None,
    )


def asap(schedule, duration, jitter=lambda: 0.0):
    """Each action started as soon as its row's previous action and its producer had ended (plus
    `jitter()` ms), lasting `duration(action)` ms: a run that followed the schedule's order."""
    times, last = {}, {}  # last[k]: stage k's latest action (start, end)
    for a in schedules.simulate(schedule).order():
        p = timeline.producer(a, schedule.stages)
        lo, hi = last.get(a.stage, (-1.0, 0.0))
        start = max(
            lo + 0.001, max(hi, times[p][1] if p in times else 0.0) + jitter()
        )  # after its row's previous start
        times[a] = last[a.stage] = (start, start + duration(a))
    return times


def measured_rows(m, schedule) -> list[list[str]]:
    """The cells of the measured grid's rows, as the log prints them."""
    lines = measured_grid.render(m, schedule, m.devices).splitlines()
    return [line.split()[3:] for line in lines[1 : 1 + schedule.stages]]  # after `stage k  /d:k`


def test_short_actions_among_long_ones_each_have_their_own_cell():
    """The issue's case: stage 0's actions a hundredth of stage 2's forwards. Equal time slots let
    them vanish; on ticks each row reads its schedule's actions, once each, in order."""
    s = schedules.build("1f1b", 3, 4)
    times = asap(s, lambda a: {0: 0.01, 1: 0.1, 2: 1.0}[a.stage] * (2 if a.kind == "B" else 1))
    m = measured(s, times)
    for k, row in enumerate(measured_rows(m, s)):
        assert [c for c in row if c not in ("-", ".")] == [str(a) for a in s.actions[k]], k
    laid = measured_grid.grid(m, m.steps[0])
    assert sorted(a for row in laid.cells for a in row if a is not None) == sorted(times)


def test_an_empty_cell_is_idle_only_where_its_device_waited():
    """Stage 1's long F0 spans a tick of stage 0's forwards: `-`, still running; stage 0 waits for
    the backwards' gradient: `.`."""
    s = schedules.build("gpipe", 2, 3)
    times = {
        act("s0 F0"): (0, 1),
        act("s0 F1"): (1, 2),
        act("s0 F2"): (2, 3),
        act("s1 F0"): (1, 4),
        act("s1 F1"): (4, 5),
        act("s1 F2"): (5, 6),
        act("s1 B0"): (6, 7),
        act("s1 B1"): (7, 8),
        act("s1 B2"): (8, 9),
        act("s0 B0"): (7, 8),
        act("s0 B1"): (8, 9),
        act("s0 B2"): (9, 10),
    }
    assert measured_rows(measured(s, times), s) == [
        "F0 F1 F2 .  .  .  B0 B1 B2".split(),
        ".  F0 -  F1 F2 B0 B1 B2 .".split(),
    ]


def test_a_pause_too_short_to_measure_is_no_wait():
    """Stage 1 pauses 3 us between its forwards while stage 0 starts one: running, not idle (its
    actions take half a millisecond); a pause of 0.1 ms is idle."""
    s = schedules.build("gpipe", 2, 3)
    for pause, running in [(0.003, True), (0.1, False)]:
        times = {
            act("s1 F0"): (2.0, 3.0),
            act("s0 F1"): (3.0005, 3.002),
            act("s0 F2"): (3.002, 3.5),
            act("s1 F1"): (3.0 + pause, 3.6),
        }
        m = measured(s, times)
        laid = measured_grid.grid(m, m.steps[0])
        assert laid.cells[1] == (act("s1 F0"), None, act("s1 F1")) and laid.running[1][1] == running, pause


def test_the_order_across_devices_is_kept_when_actions_overlap():
    """Jittered durations and starts, overlapping across devices: an action that started after
    another ended is to its right, one that started later is never to its left, and every row
    holds its actions once, in its order."""
    s = schedules.build("1f1b", 3, 4)
    rng = random.Random(3)
    for _ in range(20):
        times = asap(s, lambda a: rng.uniform(0.01, 2.0), jitter=lambda: rng.uniform(-0.3, 0.3))
        m = measured(s, times)
        acts = m.steps[0].actions
        column = measured_grid.ticks(acts, s.stages)
        at = {timeline.action(a): c for a, c in zip(acts, column)}
        for x, cx in zip(acts, column):
            for y, cy in zip(acts, column):
                if x.end_ms <= y.start_ms:
                    assert cx < cy, (x, y)
                if x.start_ms < y.start_ms:
                    assert cx <= cy, (x, y)
        for _k, row in enumerate(s.actions):
            assert [at[a] for a in row] == sorted(at[a] for a in row) and len({at[a] for a in row}) == len(row)
