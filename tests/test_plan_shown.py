"""What `placement.plan=auto` shows of its work, from an `AutoPlan` made by hand (the search is not run
here): plan_only's table of the best candidates, the chosen plan's overrides (a command line chain
accepts, giving the candidate's settings), summary.json's `plan` (written and read back), the one-line
warning when the measured step is off the prediction by more than `PLAN_MARGIN` (driven by given
timings, never by the machine's), and the report's Plan section with both figures."""

from __future__ import annotations

import html
import json
import logging
import re
import shlex
from dataclasses import replace

import pytest

import chain
from chain.autoplan import table
from chain.autoplan.step_check import PLAN_CHECK_STEPS, PLAN_MARGIN, PlanCheck
from chain.records import serial
from chain.records.auto_plan import AutoPlan, Candidate, Prediction
from chain.records.summaries import Summary
from chain.training import run as run_module
from conftest import read_summary

MiB = 1 << 20
TINY = [
    "+stages=2",
    "mode=e2e",
    "model.width=8",
    "data.batch_size=16",
    "pipeline.microbatches=2",
    "trainer.progress=false",
    "checkpoint.export=false",
    "trainer.steps_per_call=1",
]  # each step a call: the first traces, the next three are timed


def hand_made(step_s: float = 0.010) -> AutoPlan:
    """Three ranked candidates: the chosen on named devices of unknown memory, one of two copies on
    devices the planner picks (two of known memory), one interleaved."""
    chosen = Prediction(
        Candidate(1, 2, 2, "1f1b", devices=("/device:CPU:0", "/device:CPU:1")),
        step_s,
        0.25,
        (3 * MiB, 5 * MiB // 2),
        (None, None),
        16,
    )
    copies = Prediction(
        Candidate(2, 2, 1, "gpipe", recompute="always"),
        1.5 * step_s,
        0.5,
        (MiB, MiB, 2 * MiB, 2 * MiB),
        (512 * MiB, 512 * MiB, None, None),
        16,
    )
    interleaved = Prediction(
        Candidate(1, 4, 4, "interleaved", virtual_stages=2, split=(1, 1, 1, 1)),
        2 * step_s,
        0.125,
        (4 * MiB, 4 * MiB),
        (None, None),
        16,
    )
    return AutoPlan(
        chosen, (chosen, copies, interleaved), candidates=40, dropped_for_memory=7, measuring_s=2.5, searching_s=0.125
    )


def test_the_table_shows_each_candidate_its_devices_peaks_against_memory_and_the_chosen_overrides():
    plan = hand_made()
    text = table.render(plan)
    lines = text.splitlines()
    header = next(line for line in lines if line.strip().startswith("rank"))
    for column in ("plan", "step ms", "examples/s", "bubble", "peak/memory MB per device"):
        assert column in header
    rows = [line.split() for line in lines if re.match(r"\s+\d\*?\s", line)]
    assert [r[0] for r in rows] == ["1*", "2", "3"]  # the chosen marked
    for row, line, p in zip(rows, [line for line in lines if re.match(r"\s+\d\*?\s", line)], plan.ranked):
        assert table.compact(p.candidate.overrides()) in line
        assert f"{1000 * p.step_s:.2f}" in row and f"{p.examples_per_s:,.0f}" in row and f"{p.bubble:.2f}" in row
        cells = [c.rsplit(" ", 1)[1].split("/") for c in line.split(f"  {p.bubble:.2f}  ", 1)[1].strip().split(", ")]
        assert [(float(peak), None if mem == "—" else float(mem)) for peak, mem in cells] == [
            (pytest.approx(pk / MiB, rel=5e-3), None if m is None else m / MiB) for pk, m in zip(p.peaks, p.memory)
        ]
    assert "CPU:0 3/—, CPU:1 2.5/—" in text  # the chosen's named devices, memory unknown
    assert "device 0 1/512, device 1 1/512, device 2 2/—, device 3 2/—" in text
    assert f"chosen: {' '.join(plan.chosen.candidate.overrides())}" in lines
    assert lines[-1] == "planning: measured in 2.5 s, searched 40 candidates in 0.12 s (7 dropped: over memory)"
    cached = table.render(replace(plan, measuring_s=0.0, cached=True)).splitlines()[-1]
    assert cached.startswith("planning: measurements read from the run directory's cache")


def test_the_command_by_hand_is_the_users_without_plan_auto_and_composes_to_the_chosen_settings():
    plan = hand_made()
    user = [
        "+stages=3",
        "placement.plan=auto",
        "plan_only=true",
        "pipeline.microbatches=8",
        "trainer.steps=7",
        "model.width=8",
    ]
    line = next(x for x in table.render(plan, user).splitlines() if x.startswith("by hand: "))
    argv = shlex.split(line.removeprefix("by hand: "))
    assert argv[:3] == ["python", "-m", "chain"]
    assert argv[3:] == ["trainer.steps=7", "model.width=8", *plan.chosen.candidate.overrides()]
    s = chain.compose(argv[3:])  # the command line chain accepts; Hydra's composition, not ours
    c = plan.chosen.candidate
    assert (len(s.stages), s.pipeline.microbatches, s.pipeline.schedule, s.pipeline.recompute) == (
        c.stages,
        c.microbatches,
        c.schedule,
        c.recompute,
    )
    assert list(s.placement.devices) == list(c.devices) and s.trainer.steps == 7


def test_the_chosen_plans_line_names_its_overrides_prediction_and_planning_time():
    plan = hand_made()
    line = table.one_line(plan)
    assert "\n" not in line and " ".join(plan.chosen.candidate.overrides()) in line
    assert "predicted 10.00 ms per step (1,600 examples/s, bubble 0.25)" in line
    assert line.endswith(table.planning_line(plan))


def test_summary_jsons_plan_is_written_and_read_back():
    plan = hand_made()
    fields = table.plan_fields(plan, 12.5)
    assert fields.overrides == list(plan.chosen.candidate.overrides())
    assert fields.predicted_step_ms == pytest.approx(10.0) and fields.ratio == pytest.approx(1.25)
    assert [r.overrides for r in fields.ranked] == [list(p.candidate.overrides()) for p in plan.ranked]
    assert fields.ranked[0].devices == ["/device:CPU:0", "/device:CPU:1"] and fields.ranked[1].devices is None
    assert fields.ranked[1].memory_bytes == [512 * MiB, 512 * MiB, None, None]
    summary = replace(serial.from_json(Summary, {"mode": "e2e", "stages": []}), plan=fields)
    raw = json.loads(json.dumps(serial.to_json(summary)))
    assert serial.from_json(Summary, raw) == summary
    assert "plan" not in serial.to_json(replace(summary, plan=None))  # plan=manual: no key
    assert table.plan_fields(None, 12.5) is None and table.plan_fields(plan, None).ratio is None
    with pytest.raises(serial.RecordError, match=r"^plan\.ranked\[0\]\.peak_bytes\[1\] must be an integer"):
        raw["plan"]["ranked"][0]["peak_bytes"][1] = "big"
        serial.from_json(Summary, raw)


def test_the_check_is_due_once_after_its_timed_steps_and_off_past_its_margin():
    check = PlanCheck(predicted_ms=10.0)
    assert check.off(20.0) and check.off(5.0)  # twice, or half, the prediction
    assert not check.off(10.0 * (1 + PLAN_MARGIN) - 0.01) and not check.off(10.0 * (1 - PLAN_MARGIN) + 0.01)
    for per_call in (1, 3, PLAN_CHECK_STEPS + 2):  # trainer.steps_per_call
        counts = [0] + [min(i * per_call, 100) for i in range(1, 100 // per_call + 2)]  # timed steps after each call
        due = [check.due(a, b, b == 100) for a, b in zip(counts, counts[1:])]
        assert due.count(True) == 1 and counts[due.index(True) + 1] >= PLAN_CHECK_STEPS
    assert check.due(0, 3, last=True) and not check.due(0, 3, last=False)  # a short run: checked at its end
    assert not check.due(0, 0, last=True)  # nothing timed: nothing to compare


def test_the_warning_names_the_causes_that_apply():
    plan = hand_made()
    slow = table.mismatch(plan, 20.0, 10, shared_threads=False, data_wait_ms=5.0, traced=True)
    assert (
        slow.startswith(
            "plan=auto predicted 10.00 ms per step, measured 20.00 ms (2.00×, the median of the first 10 timed steps): "
        )
        and "\n" not in slow
    )
    assert "waited 5.00 ms for its batch" in slow and "trainer.profile" in slow and "thread pool" not in slow
    assert "waited" not in table.mismatch(plan, 20.0, 10, data_wait_ms=1.0)  # 5% of the step: not a cause
    fast = table.mismatch(replace(plan, cached=True), 5.0, 10, shared_threads=True)
    assert "(0.50×" in fast and "cache" in fast and "thread pool" not in fast


def test_the_loops_step_time_is_the_median_of_its_calls_shared_among_their_steps():
    loop = run_module._Loop(None, None, None, None, None, None, None)
    loop.timed((0.0,), 9.0)  # the first call traces: not counted
    assert loop.median_step_ms() is None
    loop.timed((0.0, 0.0), 0.020)  # two steps of 10 ms
    loop.timed((0.0,), 0.030)
    loop.timed((0.0,), 0.011)
    assert list(loop.step_ms) == [10.0, 10.0, 30.0, 11.0] and loop.median_step_ms() == pytest.approx(10.5)


def planned_run(tmp_path, measured_ms: float, caplog, monkeypatch, *extra: str) -> tuple[dict, list[str]]:
    """A tiny run carrying `hand_made()` (predicted 10 ms) whose measured median step is `measured_ms`;
    its summary and the plan warnings it logged (after the chosen plan's line, logged once, first)."""
    monkeypatch.setattr(run_module._Loop, "median_step_ms", lambda self: measured_ms if self.step_ms else None)
    spec = replace(chain.prepare([*TINY, "trainer.steps=4", *extra]), auto_plan=hand_made())
    run_dir = str(tmp_path / "run")
    with caplog.at_level(logging.INFO, logger="chain"):
        chain.build(spec, run_dir=run_dir).fit()
    lines = [r.getMessage() for r in caplog.records if r.name == "chain"]
    assert lines[0] == table.one_line(hand_made()) and lines.count(lines[0]) == 1
    return read_summary(run_dir), [line for line in lines if "plan=auto predicted" in line]


def test_a_run_off_its_prediction_by_two_says_so_once_and_its_summary_and_report_show_both(
    tmp_path, caplog, monkeypatch
):
    summary, warned = planned_run(tmp_path, 20.0, caplog, monkeypatch, "report=true")
    assert len(warned) == 1 and warned[0].startswith(
        "plan=auto predicted 10.00 ms per step, measured 20.00 ms (2.00×, the median of the first 3 timed steps): "
    )
    assert "logical CPU devices of one process" in warned[0]  # the cause that applies here
    plan = summary["plan"]
    assert (plan["predicted_step_ms"], plan["measured_step_ms"], plan["ratio"]) == (10.0, 20.0, 2.0)
    assert plan["overrides"] == list(hand_made().chosen.candidate.overrides()) and len(plan["ranked"]) == 3
    with open(tmp_path / "run" / "report.html") as f:
        page = f.read()
    side = re.search(r'<table id="plan">(.*?)</table>', page, re.S).group(1)
    assert re.search(r"<td>step \(ms\)</td><td class=\"num\">10</td><td class=\"num\">20</td>", side)
    assert re.search(r"<td>examples per second</td><td class=\"num\">1,?600</td><td class=\"num\">800</td>", side)
    assert "2.00×" in page and 'id="candidates"' in page
    assert html.escape(" ".join(hand_made().chosen.candidate.overrides())) in page


def test_a_run_within_the_margin_says_nothing(tmp_path, caplog, monkeypatch):
    summary, warned = planned_run(tmp_path, 10.0 * (1 + PLAN_MARGIN / 2), caplog, monkeypatch)
    assert warned == [] and summary["plan"]["ratio"] == pytest.approx(1 + PLAN_MARGIN / 2)


def test_a_plan_by_hand_has_no_plan_in_its_summary(tmp_path):
    run_dir = str(tmp_path / "manual")
    chain.build(chain.compose([*TINY, "trainer.steps=2"]), run_dir=run_dir).fit()
    assert "plan" not in read_summary(run_dir)


def test_plan_only_prints_the_table_after_the_placement(capsys):
    from chain.__main__ import show_plan

    spec = replace(chain.prepare([*TINY, "plan_only=true"]), auto_plan=hand_made())
    show_plan(spec, [*TINY, "placement.plan=auto"])
    out = capsys.readouterr().out
    assert table.render(hand_made(), [*TINY, "placement.plan=auto"]) in out
    assert out.index("stage") < out.index("placement.plan=auto: the best 3 candidates")
