"""Schedules declared by their properties (their row of `chain.schedule.schedules.BUILDERS`) and played
by one timed player (`schedules.play_timed`): no module outside chain/schedule/ compares a schedule's
name; a made-up schedule, only a builder and its row, is checked by the config, searched by plan=auto,
estimated and drawn; and the player times `simulate`, the measured replay and the planner's replay as
they were timed before it."""

from __future__ import annotations

import ast
from dataclasses import replace
from pathlib import Path

import pytest

import chain
from chain.autoplan import search
from chain.pipeline import idle
from chain.records.auto_plan import Costs
from chain.records.serial import from_json
from chain.records.summaries import Summary
from chain.report import page
from chain.report.runs import RunRecord
from chain.schedule import schedules
from chain.schedule.schedules import BACKWARD, FORWARD, WEIGHT, Action, Schedule
from test_auto_plan_search import costs

PACKAGE = Path(__file__).resolve().parents[1] / "chain"
# A 3-stage MLP chain in mode=e2e, as tests/test_pipeline.py's
SMALL = [
    "+stages=3",
    "mode=e2e",
    "model.depth=1",
    "model.width=8",
    "optim=sgd",
    "data=synthetic",
    "data.features=6",
    "data.classes=4",
    "data.samples=256",
    "data.batch_size=16",
    "pipeline.microbatches=4",
]


def _names(node: ast.AST) -> list[str]:
    """The schedule names `node` spells as string literals (itself, or a tuple, list or set of them)."""
    items = node.elts if isinstance(node, (ast.Tuple, ast.List, ast.Set)) else [node]
    return [n.value for n in items if isinstance(n, ast.Constant) and n.value in schedules.BUILDERS]


def _compared(tree: ast.AST) -> list[tuple[int, str]]:
    """(line, name) of each schedule name compared: `== "zbv"`, `in ("zb1", "zbv")`, `.startswith("zb")`."""
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare):
            out += [(node.lineno, n) for side in (node.left, *node.comparators) for n in _names(side)]
        elif isinstance(node, ast.Call) and getattr(node.func, "attr", None) in ("startswith", "endswith"):
            out += [(node.lineno, n) for arg in node.args for n in _names(arg)]
        elif isinstance(node, ast.MatchValue):
            out += [(node.lineno, n) for n in _names(node.value)]
    return out


def test_no_module_outside_chain_schedule_compares_a_schedule_name():
    """What a schedule is (split, how its stages sit on devices, searched...) is its row of BUILDERS:
    a module that compares its name would miss a schedule added as a builder and its row."""
    texts = {p: p.read_text() for p in sorted(PACKAGE.rglob("*.py")) if p.relative_to(PACKAGE).parts[0] != "schedule"}
    quoted = [f'"{name}"' for name in schedules.BUILDERS] + [f"'{name}'" for name in schedules.BUILDERS]
    found = [
        f"{path.relative_to(PACKAGE.parent)}:{line}: compares the schedule name {name!r}"
        for path, text in texts.items()
        if any(q in text for q in quoted)  # only the files that spell a name are parsed
        for line, name in sorted(_compared(ast.parse(text)))
    ]
    assert not found, "read the schedule's row of chain.schedule.schedules.BUILDERS instead:\n" + "\n".join(found)


def madeup(stages: int, microbatches: int) -> Schedule:
    """A GPipe variant: every forward, then the backwards newest first, split: every B, then every W."""
    back = range(microbatches - 1, -1, -1)
    rows = tuple(
        tuple(Action(k, m, FORWARD) for m in range(microbatches))
        + tuple(Action(k, m, BACKWARD) for m in back)
        + tuple(Action(k, m, WEIGHT) for m in back)
        for k in range(stages)
    )
    return Schedule("madeup", stages, microbatches, rows)


@pytest.fixture
def registered(monkeypatch):
    """`madeup` added as a schedule: its builder and its row, nothing else."""
    monkeypatch.setitem(schedules.BUILDERS, "madeup", schedules.Builder(madeup, split=True))


def test_a_made_up_schedule_is_checked_by_the_config_and_estimated(registered):
    spec = chain.prepare([*SMALL, "pipeline.schedule=madeup"])
    assert spec.settings.pipeline.schedule == "madeup" and spec.schedule.actions == madeup(3, 4).actions
    # the memory estimate holds what its order holds: every microbatch on every stage, and B's gradients until W
    assert [f.held for f in spec.assignment.footprints] == schedules.held_counts(spec.schedule) == [4, 4, 4]
    with pytest.raises(chain.ConfigError, match="pipeline.recompute=always is not available with a split backward"):
        chain.compose([*SMALL, "pipeline.schedule=madeup", "pipeline.recompute=always"])  # its row: split


def test_a_made_up_schedule_is_searched_by_plan_auto_and_drawn(registered):
    found = search.candidates(costs([1e-3] * 4), 16, [2])
    mine = [c for c, _ in found if c.schedule == "madeup"]
    assert mine and {c.recompute for c in mine} == {"never"}  # a split backward is never recomputed
    ranked = search.search(costs([1e-3] * 4, action_s=1e-4), 16, [2], max_microbatches=4)
    assert ranked.candidates == len(search.candidates(costs([1e-3] * 4), 16, [2], max_microbatches=4))
    predicted = search.predict(costs([1e-3] * 4), mine[0], [0, 2, 4], 16)
    assert predicted.step_s > 0
    summary = {"schedule": "madeup", "microbatches": 2, "bubble_fraction": 0.5, "stages": [{"index": 0}, {"index": 1}]}
    record = RunRecord("run", summary=from_json(Summary, summary))  # a run's summary.json, as the report reads it
    assert record.schedule().actions == madeup(2, 2).actions
    drawn = page.timeline_section(record)
    assert "madeup, 2 stages x 2 microbatches" in drawn and "<img" in drawn


# The three players' results before they became one (`simulate`, `idle.step_and_bubble`, `search.step_and_bubble`),
# computed by the code of the time: the one player must time every action as they did.
PLANNED = {
    ("zb1", 3, 5, None): (
        0.11764705882352941,
        [
            "stage 0  F0 F1 F2 .  .  B0 W0 F3 B1 W1 F4 B2 W2 B3 W3 B4 W4",
            "stage 1  .  F0 F1 .  B0 F2 B1 W0 F3 B2 W1 F4 B3 W2 B4 W3 W4",
            "stage 2  .  .  F0 B0 F1 B1 F2 B2 W0 F3 B3 W1 F4 B4 W2 W3 W4",
        ],
    ),
    ("zbv", 4, 3, None): (
        0.05263157894736842,
        [
            "device 0 (stages 0, 3)  F0@s0 F1@s0 F2@s0 F0@s3 B0@s3 W0@s3 F1@s3 B1@s3 W1@s3 B0@s0 W0@s0 F2@s3 B2@s3 "
            "W2@s3 B1@s0 W1@s0 B2@s0 W2@s0 .",
            "device 1 (stages 1, 2)  .     F0@s1 F0@s2 F1@s1 F1@s2 B0@s2 W0@s2 F2@s1 B0@s1 W0@s1 F2@s2 B1@s2 W1@s2 "
            "B1@s1 B2@s2 B2@s1 W1@s1 W2@s2 W2@s1",
        ],
    ),
    ("interleaved", 4, 4, 2): (
        0.1111111111111111,
        [
            "device 0 (stages 0, 2)  F0@s0 F1@s0 F0@s2 F1@s2 F2@s0 B0@s2 F3@s0 B1@s2 F2@s2 B0@s0 F3@s2 B1@s0 .     "
            "B2@s2 .     B3@s2 B2@s0 B3@s0",
            "device 1 (stages 1, 3)  .     F0@s1 F1@s1 F0@s3 B0@s3 F1@s3 B1@s3 F2@s1 B0@s1 F3@s1 B1@s1 F2@s3 B2@s3 "
            "F3@s3 B3@s3 B2@s1 B3@s1 .",
        ],
    ),
}


@pytest.mark.parametrize("name, k, m, d", list(PLANNED))
def test_simulate_plays_each_schedule_as_before(name, k, m, d):
    s = schedules.build(name, k, m, d)
    timeline = schedules.simulate(s)
    bubble, grid = PLANNED[(name, k, m, d)]
    assert schedules.rows(timeline, schedule=s) == grid and timeline.bubble_fraction == pytest.approx(bubble)


@pytest.mark.parametrize(
    "name, k, m, d, grad_accum, expected",
    [
        ("1f1b", 4, 6, None, 1, (37.5, 0.4)),
        ("zb1", 3, 5, None, 2, (58.0, 0.26724137931034486)),
        ("interleaved", 6, 6, 3, 2, (130.0, 0.2153846153846154)),
        ("zbv", 6, 7, None, 1, (82.5, 0.08787878787878789)),
    ],
)
def test_the_measured_replay_plays_each_schedule_as_before(name, k, m, d, grad_accum, expected):
    durations = {(j, kind): 1.0 + 0.25 * j + {"F": 0.0, "B": 1.0, "W": -0.5}[kind] for j in range(k) for kind in "FBW"}
    assert idle.step_and_bubble(schedules.build(name, k, m, d), durations, grad_accum) == pytest.approx(
        expected, rel=1e-12
    )


def _planner_costs(kind: str, devices: int = 8) -> Costs:
    """Costs with a cost per action and a transfer (`plain`), on one physical device (`shared`), and
    with updates, a step's cost, the copies' exchange and a transfer's latency (`full`)."""
    plain = costs([1e-3, 2e-3, 1.5e-3, 1e-3, 3e-3, 1e-3], action_s=1e-4, transfer=1e-7, devices=devices)
    if kind == "shared":
        return costs([1e-3] * 6, action_s=5e-5, devices=4, shared=True)
    if kind == "full":
        return replace(
            plain,
            update=(1e-4,) * 6,
            update_s=2e-5,
            step_s=1e-3,
            exchange_s_per_byte=1e-9,
            exchange_latency_s=3e-4,
            transfer_latency_s=2e-5,
        )
    return plain


@pytest.mark.parametrize(
    "kind, name, k, m, d, replicas, recompute, grad_accum, expected",
    [
        ("full", "zbv", 4, 4, None, 2, "except_last", 2, (0.38863053333333325, 0.08803679048725166)),
        ("full", "interleaved", 4, 4, 2, 2, "always", 1, (0.29188320000000006, 0.3690742413560122)),
        ("full", "gpipe", 2, 4, None, 1, "except_last", 1, (0.24819573333333333, 0.22559439169126638)),
        ("shared", "1f1b", 3, 6, None, 1, "always", 2, (0.7080000000000002, 0.6666666666666667)),
        ("plain", "zb1", 3, 4, None, 2, "never", 1, (0.14456906666666666, 0.28879796683153514)),
    ],
)
def test_the_planners_replay_plays_each_schedule_as_before(
    kind, name, k, m, d, replicas, recompute, grad_accum, expected
):
    c = _planner_costs(kind)
    s = schedules.build(name, k, m, d)
    times = search.stage_times(c, [0, *[(j + 1) * 6 // k for j in range(k)]], 8)
    if kind == "shared":
        physical = [["P0"] * s.devices for _ in range(replicas)]
    else:
        physical = [[f"q{r}{i}" for i in range(s.devices)] for r in range(replicas)] if replicas > 1 else None
    got = search.step_and_bubble(
        s, times, c, replicas=replicas, recompute=recompute, grad_accum=grad_accum, rows_physical=physical
    )
    assert got == pytest.approx(expected, rel=1e-12)


def test_the_search_chooses_as_before():
    plan = search.search(_planner_costs("full", devices=4), 64, [4], max_microbatches=16)
    assert plan.candidates == 69 and plan.chosen.candidate.overrides() == (
        "+stages=4",
        "pipeline.microbatches=4",
        "pipeline.schedule=zbv",
        "pipeline.recompute=never",
        "placement.replicas=2",
        "placement.split=[2,2,1,1]",
    )
    assert [p.step_s for p in plan.ranked[:3]] == pytest.approx([0.1886124, 0.18698680000000004, 0.18977399999999991])


def test_the_player_gives_each_action_its_start_and_end_and_each_row_its_busy_time():
    s = schedules.build("1f1b", 2, 2)
    timed = schedules.play_timed(s, lambda a: 2.0 if a.kind == BACKWARD else 1.0)
    assert [(timed.start[a], timed.end[a]) for a in timed.rows[1]] == [(1.0, 2.0), (2.0, 4.0), (4.0, 5.0), (5.0, 7.0)]
    assert timed.busy == (6.0, 6.0) and timed.span == 9.0 and timed.idle == (3.0, 3.0)
    assert timed.bubble_fraction == pytest.approx(1 / 3)
