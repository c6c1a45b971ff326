"""trainer.profile: a traced window of steps becomes a measured timeline (timeline.json) with
every action of the schedule, in its step and in the schedule's order; its statistics and
the balance advice are checked on synthetic traces whose answer is known."""

from __future__ import annotations

import json
import logging
import os
from dataclasses import replace

import pytest

import chain
from chain.errors import ConfigError
from chain.schedule import schedules
from chain.schedule.schedules import Action
from chain.pipeline import idle, measured_grid, timeline
from chain.records.measured import MeasuredTimeline
from chain.records.serial import from_json
from chain.report import page, runs
from chain.pipeline.timeline import OpEvent
from conftest import EXTENDED

SMALL = ["model.width=16", "data.batch_size=32", "trainer.progress=false", "checkpoint.export=false"]


@pytest.fixture(scope="module")
def profiled(tmp_path_factory):
    """A 3-stage 1F1B run whose steps 2 and 3 are traced; steps_per_call=3, so the loop must
    cut its calls at the window (calls: 1 | 2 | 3 | 4-5)."""
    run_dir = str(tmp_path_factory.mktemp("profiled"))
    cfg = chain.compose(
        [
            "+stages=3",
            "mode=e2e",
            "pipeline.schedule=1f1b",
            "pipeline.microbatches=4",
            *SMALL,
            "trainer.steps=5",
            "trainer.steps_per_call=3",
            "trainer.profile=[2,3]",
        ]
    )
    run = chain.build(cfg, run_dir=run_dir)
    summary = run.fit()
    with open(os.path.join(run_dir, "timeline.json")) as f:
        return run, summary, json.load(f), run_dir


def test_the_timeline_has_every_action_of_every_stage_inside_its_step_in_the_schedules_order(profiled):
    run, _, measured, _ = profiled
    assert [s["step"] for s in measured["steps"]] == [2, 3]
    for step in measured["steps"]:
        assert step["complete"]
        for k, planned in enumerate(run.schedule.actions):
            mine = [a for a in step["actions"] if a["stage"] == k]
            # every action once, nothing else
            assert sorted((a["microbatch"], a["kind"]) for a in mine) == sorted((a.microbatch, a.kind) for a in planned)
            for a in mine:
                assert step["start_ms"] <= a["start_ms"] <= a["end_ms"] <= step["end_ms"], (k, a)
            by_start = [Action(k, a["microbatch"], a["kind"]) for a in sorted(mine, key=lambda a: a["start_ms"])]
            assert by_start == list(planned), k
        assert sorted(u["stage"] for u in step["updates"]) == [0, 1, 2]
    assert measured["devices"] == [s.device for s in run.stages]


def test_the_summary_holds_the_measured_figures(profiled):
    run, summary, measured, run_dir = profiled
    assert 0.0 <= summary["measured_bubble_fraction"] < 1.0
    assert summary["measured_bubble_fraction"] == measured["measured_bubble_fraction"]
    assert summary["profiled_steps"] == [2, 3]
    for stage in summary["stages"]:
        assert 0.0 < stage["busy_fraction"] <= 1.0
        assert stage["forward_ms"] > 0 and stage["backward_ms"] > 0 and stage["copy_ms"] >= 0
    # the trace stays under the run directory, where TensorBoard's profile plugin looks
    (trace,) = measured["trace"]
    assert trace.startswith(os.path.join("tb", "chain", "plugins", "profile"))
    assert timeline.trace_files(os.path.join(run_dir, "tb", "chain"))


def test_the_measured_grid_lists_every_action_of_every_stage_in_its_order(profiled):
    """The log's measured grid: a cell per action (4 F and 4 B per stage), each row in the plan's order."""
    run, _, measured, _ = profiled
    lines = measured_grid.render(from_json(MeasuredTimeline, measured), run.schedule, measured["devices"]).splitlines()
    for k, (line, planned) in enumerate(zip(lines[1:4], run.schedule.actions)):
        assert line.startswith(f"stage {k}  {measured['devices'][k]}  "), line
        assert [c for c in line.split()[3:] if c not in "-."] == [str(a) for a in planned], line


def test_profiling_does_not_change_training(profiled):
    run, summary, _, _ = profiled
    cfg = chain.compose(
        ["+stages=3", "mode=e2e", "pipeline.schedule=1f1b", "pipeline.microbatches=4", *SMALL, "trainer.steps=5"]
    )
    plain = chain.build(cfg).fit()
    assert plain["loss_last"] == summary["loss_last"]


@pytest.mark.parametrize(
    "schedule, overrides",
    [
        pytest.param("zb1", ["+stages=2"], marks=EXTENDED),  # the suite's time: zbv's W actions are measured every time
        ("interleaved", ["+stages=4", "pipeline.virtual_stages=2"]),  # 4 stages on 2 devices
        ("zbv", ["+stages=4"]),  # 4 stages on 2 devices in a V, split backwards
    ],
)
def test_zb1_interleaved_and_zbv_are_measured_action_by_action(schedule, overrides, tmp_path, caplog, monkeypatch):
    """Every F, B and W of every stage is in the measured timeline, in the schedule's order for
    that stage. The log's plan and the report's planned chart have one row per device (interleaved,
    zbv: two stages each, every cell naming its stage), the report's measured chart one per stage, and
    both charts draw W bars for zb1 and zbv; the log's measured grid has a row per stage with a cell
    per action."""
    run_dir = str(tmp_path)
    cfg = chain.compose(
        [
            *overrides,
            "mode=e2e",
            f"pipeline.schedule={schedule}",
            "pipeline.microbatches=2",
            *SMALL,
            "trainer.steps=3",
            "trainer.profile=[2,3]",
        ]
    )
    run = chain.build(cfg, run_dir=run_dir)
    with caplog.at_level(logging.INFO, logger="chain"):
        summary = run.fit()
    with open(os.path.join(run_dir, "timeline.json")) as f:
        measured = json.load(f)
    kinds = "BF" if schedule == "interleaved" else "BFW"
    assert [s["step"] for s in measured["steps"]] == [2, 3] and all(s["complete"] for s in measured["steps"])
    for step in measured["steps"]:
        for k in range(len(run.stages)):
            planned = [a for row in run.schedule.actions for a in row if a.stage == k]
            assert "".join(sorted({a.kind for a in planned})) == kinds
            mine = sorted((a for a in step["actions"] if a["stage"] == k), key=lambda a: a["start_ms"])
            assert [Action(k, a["microbatch"], a["kind"]) for a in mine] == planned, k
    assert 0.0 <= summary["measured_bubble_fraction"] < 1.0
    (text,) = [r.getMessage() for r in caplog.records if r.getMessage().startswith("planned and measured timelines")]
    plan = text.split("\nmeasured: step ", 1)[0].splitlines()
    for k, line in enumerate(text.split("\nmeasured: step ", 1)[1].splitlines()[1 : 1 + len(run.stages)]):
        planned = [str(a) for row in run.schedule.actions for a in row if a.stage == k]
        assert [c for c in line.split()[3:] if c not in "-."] == planned, line
    if schedule == "zb1":
        assert "W: weight gradients" in plan[1] and {"W0", "W1"} <= set(plan[2].split())  # stage 0's row
        devices = ["stage 0  /device:CPU:0", "stage 1  /device:CPU:1"]
    elif schedule == "interleaved":
        devices = ["device 0 (stages 0, 2)", "device 1 (stages 1, 3)"]
        assert plan[2].startswith(devices[0]) and "F0@s2" in plan[2].split() and "B1@s3" in plan[3].split()
    else:  # the V: the first and last stages on device 0
        devices = ["device 0 (stages 0, 3)", "device 1 (stages 1, 2)"]
        assert plan[2].startswith(devices[0]) and "W0@s3" in plan[2].split() and "B1@s2" in plan[3].split()
    # The report: what its two timeline charts draw (the charts themselves are PNGs).
    from chain.report import page, runs

    charts = {}
    monkeypatch.setattr(
        page.plots,
        "gantt",
        lambda rows, labels, title, xlabel: (
            charts.setdefault(title.split(":")[0].split(" ")[0], (rows, labels)) and b""
        ),
    )
    page.timeline_section(runs.load(run_dir))
    (planned_rows, planned_labels), (measured_rows, measured_labels) = charts["planned"], charts["measured"]
    assert planned_labels == devices
    assert measured_labels == [f"stage {k}  {s.device}" for k, s in enumerate(run.stages)]
    for rows in (planned_rows, measured_rows):
        assert "".join(sorted({kind for row in rows for _, _, kind, _ in row} - {"update"})) == kinds


def test_every_copy_of_the_pipeline_is_measured_action_by_action(tmp_path, caplog, monkeypatch):
    """placement.replicas=2: the trace holds F and B of both copies (copy 1's scopes `r1_s{k}_...`), each
    copy's stages in the schedule's order with its update; the log's measured grid and the report's
    measured chart have a row per device of every copy."""
    run_dir = str(tmp_path)
    cfg = chain.compose(
        [
            "+stages=2",
            "mode=e2e",
            "pipeline.schedule=1f1b",
            "pipeline.microbatches=1",
            "placement.replicas=2",
            *SMALL,
            "trainer.steps=2",
            "trainer.profile=[2,2]",
        ]
    )
    run = chain.build(cfg, run_dir=run_dir)
    with caplog.at_level(logging.INFO, logger="chain"):
        run.fit()
    with open(os.path.join(run_dir, "timeline.json")) as f:
        measured = json.load(f)
    grid = run.assignment.copies
    assert measured["replicas"] == 2 and measured["devices"] == [d for row in grid for d in row]
    (step,) = measured["steps"]
    assert step["complete"]
    for r in range(2):
        for k, planned in enumerate(run.schedule.actions):
            mine = sorted(
                (a for a in step["actions"] if (a["replica"], a["stage"]) == (r, k)), key=lambda a: a["start_ms"]
            )
            assert [Action(k, a["microbatch"], a["kind"], r) for a in mine] == [a._replace(replica=r) for a in planned]
    assert sorted((u["replica"], u["stage"]) for u in step["updates"]) == [(0, 0), (0, 1), (1, 0), (1, 1)]
    assert [(p["replica"], p["stage"], p["device"]) for p in measured["per_stage"]] == [
        (r, k, grid[r][k]) for r in range(2) for k in range(2)
    ]
    (text,) = [r.getMessage() for r in caplog.records if r.getMessage().startswith("planned and measured timelines")]
    measured_rows = text.split("\nmeasured: step ", 1)[1].splitlines()[1:5]
    assert [row.split("  ")[0] for row in measured_rows] == [f"copy {r} stage {k}" for r in range(2) for k in range(2)]
    from chain.report import page, runs

    charts = {}
    monkeypatch.setattr(
        page.plots,
        "gantt",
        lambda rows, labels, title, xlabel: (
            charts.setdefault(title.split(":")[0].split(" ")[0], (rows, labels)) and b""
        ),
    )
    page.timeline_section(runs.load(run_dir))
    rows, labels = charts["measured"]
    assert labels == [f"copy {r} stage {k}  {grid[r][k]}" for r in range(2) for k in range(2)]
    assert all({kind for _, _, kind, _ in row} == {"F", "B", "update"} for row in rows)


def test_the_vocabulary_carries_the_copy_of_the_pipeline():
    """One format, printed and parsed by `Action`: copy 0 (and a pipeline without copies) as before."""
    for a in [Action(1, 3, "F"), Action(0, 12, "B", 1), Action(2, 0, "W", 3)]:
        assert Action.parse(a.scope()) == a and Action.parse(f"{a.scope()}/stage_01/dense/MatMul") == a
    assert Action(1, 0, "F", 2).scope() == "r2_s1_F0" and Action(1, 0, "F").scope() == "s1_F0"
    tape, update = "gradient_tape/r1_s0_F2/stage_00_1/dense/MatMul", "r1_s1_update/Sum"
    assert (timeline.owner(tape), timeline.copy_of(tape)) == (("B", 0, 2), 1)
    assert (timeline.owner(update), timeline.copy_of(update)) == (("update", 1, -1), 1)
    assert timeline.copy_of("s1_update/Sum") == 0 and timeline.copy_of("gradient_tape/s0_F2/x") == 0
    assert timeline.owner("release_r1_s0_F1") is None and Action.parse("r1_x") is None


# --- the statistics, on synthetic traces ---------------------------------------------------------


def synthetic(schedule, durations, step=(0, 10**9), gap=0):
    """Events that play `schedule` as `simulate` does, slot t lasting durations[kind] ns per stage."""
    grid = schedules.simulate(schedule).grid
    slot = max(durations.values()) + gap
    events = []
    for _k, row in enumerate(grid):
        for t, a in enumerate(row):
            if a is not None:
                start = step[0] + t * slot
                scope = (
                    f"s{a.stage}_{a.kind}{a.microbatch}"
                    if a.kind != "B"
                    else f"gradient_tape/s{a.stage}_F{a.microbatch}"
                )
                events.append(OpEvent(f"{scope}/matmul", "MatMul", start, start + durations[a.kind], "vm"))
                events.append(OpEvent(f"{scope}/w/ReadVariableOp", "ReadVariableOp", step[0], step[0] + 1, "vm"))
    return events


@pytest.mark.parametrize("name", ["gpipe", "1f1b", "interleaved"])
def test_unit_time_actions_measure_the_planned_bubble(name):
    # interleaved: 6 stages on 3 devices; a device is idle only while none of its stages works
    s = schedules.build(name, 6, 3, 3) if name == "interleaved" else schedules.build(name, 3, 3)
    events = synthetic(s, {"F": 1000, "B": 1000})
    m = timeline.measure(s, events, {7: (0, 10**9)}, [f"/d:{k % 3}" for k in range(s.stages)])
    assert m.steps[0].complete
    assert m.measured_bubble_fraction == pytest.approx(schedules.simulate(s).bubble_fraction)
    assert m.planned_bubble_fraction == pytest.approx(schedules.simulate(s).bubble_fraction)
    assert [p.forward_ms for p in m.per_stage] == pytest.approx([3 * 1e-3] * s.stages)
    if name != "interleaved":  # the measured text grid has a row per stage, the plan one per device
        # the text grid of a step that followed the plan is the plan
        laid = measured_grid.grid(m, m.steps[0])
        assert laid.cells == schedules.simulate(s).grid and not any(map(any, laid.running))


def test_a_missing_action_leaves_its_step_out_of_the_statistics():
    s = schedules.build("gpipe", 2, 2)
    events = [e for e in synthetic(s, {"F": 10, "B": 10}) if not e.name.startswith("gradient_tape/s0_F1")]
    m = timeline.measure(s, events, {1: (0, 10**6)}, ["/d:0", "/d:1"])
    assert not m.steps[0].complete and m.measured_bubble_fraction is None


def test_a_weight_action_without_ops_keeps_its_step_measured():
    """When B took a stage's weight gradients (a transformer block's stage, `play.whole_backward`), its first W
    only keeps them as the sums and has no op: the step is still measured (zbv's traced GPT2 measured no step)."""
    s = schedules.build("zb1", 2, 2)
    events = [e for e in synthetic(s, {"F": 10, "B": 10, "W": 10}) if not e.name.startswith("s0_W0/")]
    m = timeline.measure(s, events, {1: (0, 10**6)}, ["/d:0", "/d:1"])
    assert m.steps[0].complete and m.measured_bubble_fraction is not None
    assert (0, 0, "W", 0) not in {a.key() for a in m.steps[0].actions}
    why = idle.explain(m, s)  # where the step idles: the W has no time of its own
    assert why is not None and why.devices[0].busy_ms > 0
    gone = [e for e in synthetic(s, {"F": 10, "B": 10, "W": 10}) if not e.name.startswith("s0_F1/")]
    assert not timeline.measure(s, gone, {1: (0, 10**6)}, ["/d:0", "/d:1"]).steps[0].complete


def test_sources_pick_each_stages_worker():
    s = schedules.build("gpipe", 2, 1)
    events = synthetic(s, {"F": 10, "B": 10})
    stray = OpEvent("s1_F0/late", "AddV2", 500, 900, "client")  # the same scope, seen on another host
    m = timeline.measure(s, events + [stray], {1: (0, 10**6)}, ["/w0", "/w1"], sources=["vm", "vm"])
    f = [a for a in m.steps[0].actions if (a.stage, a.kind) == (1, "F")][0]
    assert f.end_ms < 500 / 1e6


def test_a_step_that_a_workers_trace_does_not_hold_is_not_measured():
    """Two steps, each stage's ops from its own worker's trace: a trace that began after step 1 began
    (or ended before it ended) holds only part of it, whose actions would look shorter than they ran."""
    s = schedules.build("gpipe", 2, 2)
    steps = {1: (0, 10**5), 2: (10**6, 10**6 + 10**5)}
    events = [
        replace(e, source=f"w{Action.parse(e.name.removeprefix('gradient_tape/')).stage}")
        for step in steps.values()
        for e in synthetic(s, {"F": 10, "B": 10}, step=step)
    ]
    both = {"w0": (0, 2 * 10**6), "w1": (-5, 2 * 10**6)}
    whole = timeline.measure(s, events, steps, ["/w0", "/w1"], sources=["w0", "w1"], spans=both)
    assert [st.complete for st in whole.steps] == [True, True]
    for late in [{**both, "w1": (50, 2 * 10**6)}, {**both, "w0": (0, 10**5 - 1)}]:  # began in step 1 / ended in it
        m = timeline.measure(s, events, steps, ["/w0", "/w1"], sources=["w0", "w1"], spans=late)
        held = [st.complete for st in m.steps]
        assert held == ([False, True] if late["w1"][0] == 50 else [False, False])
        assert all(len(st.actions) == 8 for st in m.steps)  # every action has ops: only the spans tell
    gone = timeline.measure(s, events, steps, ["/w0", "/w1"], sources=["w0", "w1"], spans={"w0": both["w0"]})
    assert not any(st.complete for st in gone.steps) and gone.measured_bubble_fraction is None


def test_a_worker_whose_trace_does_not_hold_a_step_is_named_with_the_steps(caplog):
    from chain.training.profile import Window

    window = Window.__new__(Window)  # only what the warning reads: the workers' profilers and each stage's trace
    window.remote = ["localhost:2232", "localhost:2233", "localhost:2234"]  # the third holds no stage
    window.sources = lambda: ["localhost_2232", "localhost_2233"]
    steps = {3: (10, 20), 4: (30, 40)}
    with caplog.at_level(logging.WARNING, logger="chain"):
        window.warn_unheld(steps, {"localhost_2232": (0, 100), "localhost_2233": (15, 100)})
        window.warn_unheld(steps, {"localhost_2232": (0, 35)})
    assert caplog.messages == [
        "profile: the trace of worker 1 (localhost:2233) began after or ended before step 3 (not held whole): "
        "not measured",
        "profile: the trace of worker 0 (localhost:2232) began after or ended before step 4 (not held whole): "
        "not measured",
        "profile: worker 1 (localhost:2233) wrote no trace: steps 3, 4 not measured",
    ]


def test_owner_maps_scopes_to_actions():
    assert timeline.owner("s2_F3/stage_02_1/dense/MatMul") == ("F", 2, 3)
    assert timeline.owner("gradient_tape/s1_F0/stage_01_1/dense/MatMul") == ("B", 1, 0)
    assert timeline.owner("s0_B12/add_1") == ("B", 0, 12)
    assert timeline.owner("s1_update/Sum") == ("update", 1, -1)
    assert timeline.owner("release_s0_F1") is None and timeline.owner("microbatches") is None


def test_copy_wait_is_the_idle_time_after_an_input_was_ready():
    s = schedules.build("sequential", 2, 1)  # F(0) F(1) B(1) B(0)
    ev = [
        OpEvent("s0_F0/a", "MatMul", 0, 100, "vm"),
        OpEvent("s1_F0/a", "MatMul", 130, 200, "vm"),
        OpEvent("gradient_tape/s1_F0/a", "MatMul", 200, 300, "vm"),
        OpEvent("gradient_tape/s0_F0/a", "MatMul", 350, 400, "vm"),
    ]
    m = timeline.measure(s, ev, {1: (0, 1000)}, ["/d:0", "/d:1"])
    assert [p.copy_wait_ms for p in m.per_stage] == pytest.approx([50e-6, 30e-6])
    assert m.measured_bubble_fraction == pytest.approx(1 - (150 + 170) / (2 * 400))


def test_advice_moves_layers_off_the_slow_stage():
    advice = timeline.advise([30.0, 10.0, 10.0], [3, 3, 3])  # stage 0's layers cost 10, the others' 10/3
    assert advice.stage == 0 and advice.excess == pytest.approx(0.8)
    # the busiest stage can go from 30 down to 20 (two layers of 10), no lower
    assert advice.split == [2, 2, 5] and max(advice.predicted_ms) == pytest.approx(20.0)
    assert advice.moves == [-1, -1, 2]
    text = timeline.advice_text(advice, "placement.split=[2,2,5]")
    assert text.startswith("stage 0 is the bottleneck") and text.endswith("placement.split=[2,2,5]")
    assert timeline.advise([10.0, 11.0, 10.5], [3, 3, 3]) is None  # within 20% of the mean


def test_advice_weighs_a_cut_models_layers_by_their_parameters():
    """GPT2CausalLM's 10 layers cut [5, 5] (embeddings and 1 block | 3 blocks, the tied read-out), as profiled on
    two workers: counted alike, the layers would move 2 blocks; weighed, one block moves (the balanced [6, 4])."""
    shares = [[65536, 16384, 0, 0, 198272], [198272, 198272, 198272, 256, 65536]]
    assert timeline.advise([98.0, 326.0], [5, 5]).split == [7, 3]
    advice = timeline.advise([98.0, 326.0], [5, 5], shares=shares)
    assert advice.split == [6, 4] and advice.moves == [1, -1]
    assert timeline.advise([30.0, 10.0, 10.0], [3, 3, 3], shares=[[0, 0, 0]] * 3).split == [2, 2, 5]  # none weigh


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["trainer.profile=[3,2]"], "START must be <= STOP"),
        (["trainer.profile=[2,9]"], "goes past trainer.steps=5"),
        (["trainer.profile=[0,1]"], "must be >= 1"),
        (["trainer.profile=3"], "must be [START,STOP]"),
        (["mode=local", "trainer.profile=[1,2]"], "needs mode=e2e"),
        (["cluster.workers=[localhost:2222,localhost:2223]", "trainer.profile=[1,2]"], "cluster.profile_ports"),
    ],
)
def test_bad_profile_settings_are_one_line_naming_the_key(overrides, message):
    with pytest.raises(ConfigError) as e:
        chain.compose(["+stages=2", "mode=e2e", "trainer.steps=5", *overrides])
    assert message in str(e.value) and "\n" not in str(e.value)


def test_a_mirrored_run_has_no_schedule_to_profile(tmp_path):
    cfg = chain.compose(
        ["+stages=2", "mode=e2e", "placement.fallback=mirrored", *SMALL, "trainer.steps=2", "trainer.profile=[1,1]"]
    )
    with pytest.raises(ConfigError, match="trainer.profile measures a pipeline schedule"):
        chain.build(cfg, run_dir=str(tmp_path)).fit()
    assert not os.path.exists(tmp_path / "timeline.json")


def test_the_advice_names_the_override_that_moves_layers():
    import keras

    from chain.training.profile import layers_and_override

    own = chain.build(chain.compose(["+stages=2", "mode=e2e", *SMALL]))
    assert layers_and_override(own.stages, [3, 1]) == ([2, 2], "'+stages=[{model: {depth: 3}},{model: {depth: 1}}]'")
    model = keras.Sequential(
        [
            keras.Input((8, 8, 1)),
            keras.layers.Flatten(),
            *[keras.layers.Dense(8) for _ in range(4)],
            keras.layers.Dense(10),
        ]
    )
    cut = chain.build(chain.compose(["+stages=2", "mode=e2e", *SMALL]), model=model)
    assert layers_and_override(cut.stages, [4, 2]) == ([3, 3], "placement.split=[4,2]")  # the model's 6 layers


# --- advice moves layers, never changes them -----------------------------------------------------------
ADVISED = ["mode=e2e", "data=synthetic", "data.batch_size=32", "trainer.progress=false", "checkpoint.export=false"]
WIDE_THEN_NARROW = (
    "+stages=[{model: {width: 256, depth: 6}},{model: {width: 16, depth: 1}},{model: {width: 16, depth: 1}}]"
)


def network(run) -> tuple[int, list[tuple[str, list[tuple]]]]:
    """The whole chain as one network: its parameter count and its layers in order (kind, weight shapes)."""
    layers = [
        (type(layer).__name__, [tuple(w.shape) for w in layer.weights]) for s in run.stages for layer in s.model.layers
    ]
    return sum(s.params for s in run.stages), layers


def advice_for(run, busy, tmp_path) -> dict | None:
    """The advice the profiler gives `run` for measured busy times `busy` (ms per step, per stage)."""
    from chain.records.serial import to_json
    from chain.training.profile import Window

    advice = Window(run, 1, 1).advice(from_json(MeasuredTimeline, {"per_stage": [{"busy_ms": b} for b in busy]}))
    return None if advice is None else to_json(advice)  # as timeline.json holds it


@pytest.mark.parametrize(
    "stages, busy",
    [
        ([WIDE_THEN_NARROW], [60.0, 5.0, 6.0]),
        (
            ["+stages=[{model: {width: 256, depth: 2}},{model: {width: 16, depth: 1}},{model: {width: 16, depth: 3}}]"],
            [10.0, 5.0, 60.0],
        ),
        (
            ["+stages=[{model: {width: 32, depth: 1}},{model: {width: 32, depth: 3}}]"],
            [10.0, 40.0],
        ),  # not the template's width
        (
            ["+stages=[{model: {depth: 1}},{model: {depth: 3, dropout: 0.1}},{model: {depth: 3, dropout: 0.1}}]"],
            [5.0, 40.0, 10.0],
        ),
        (
            [
                "data=digits",
                "+stages=[{model: {name: conv, filters: 4, depth: 1}},{model: {name: conv, filters: 4, depth: 3}},"
                "{model: {depth: 1}, optim: {lr: 0.01}}]",
            ],
            [5.0, 60.0, 6.0],
        ),  # other bodies, another optimizer
    ],
)
def test_the_advised_override_keeps_the_whole_network(stages, busy, tmp_path):
    run = chain.build(chain.compose([*ADVISED, *stages]), run_dir=str(tmp_path))
    advice = advice_for(run, busy, tmp_path)
    assert advice and advice["override"], advice
    advised = chain.build(chain.compose([*ADVISED, *stages[:-1], advice["override"].strip("'")]))
    assert [s.spec.model.depth for s in advised.stages] == advice["split"] != advice["layers"]
    assert network(advised) == network(run)
    # every layer keeps its optimizer too
    assert [s.spec.optim for s in advised.stages for _ in range(s.spec.model.depth)] == [
        s.spec.optim for s in run.stages for _ in range(s.spec.model.depth)
    ]


def test_the_reproduction_keeps_its_341860_parameters(tmp_path):
    run = chain.build(chain.compose([*ADVISED, WIDE_THEN_NARROW]), run_dir=str(tmp_path))
    assert network(run)[0] == 341_860
    advice = advice_for(run, [60.0, 5.0, 6.0], tmp_path)
    assert advice["override"] == (
        "'+stages=[{model: {width: 256, depth: 3}},{model: {width: 256, depth: 3}},{model: {width: 16, depth: 2}}]'"
    )
    assert advice["fixed_cuts"] == [6] and max(advice["predicted_ms"]) == pytest.approx(30.0)


def test_stages_that_cannot_be_rebalanced_without_changing_the_network_say_so(tmp_path):
    run = chain.build(
        chain.compose([*ADVISED, "+stages=[{model: {width: 64, depth: 3}},{model: {width: 16, depth: 1}}]"]),
        run_dir=str(tmp_path),
    )
    advice = advice_for(run, [60.0, 5.0], tmp_path)  # moving a 64-wide layer to the 16-wide stage would even it
    assert advice["split"] == advice["layers"] == [3, 1] and advice["override"] is None and advice["constrained"]
    assert "its stages cannot be rebalanced without changing the network" in advice["text"]
    assert "model=keras with placement.split" in advice["text"]


def test_a_profiled_chain_of_different_widths_is_advised_an_override_that_keeps_it(tmp_path):
    """The issue's reproduction, measured (batches of 512, so the 256-wide stage is the bottleneck even on
    logical CPU devices sharing one thread pool): whatever the trace says, the advice keeps the network."""
    run = chain.build(
        chain.compose(
            [
                *ADVISED,
                WIDE_THEN_NARROW,
                "data.batch_size=512",
                "data.samples=2048",
                "trainer.steps=4",
                "trainer.profile=[3,4]",
            ]
        ),
        run_dir=str(tmp_path),
    )
    summary = run.fit()
    with open(tmp_path / "timeline.json") as f:
        advice = json.load(f)["advice"]
    assert advice is not None and summary["balance_advice"] == advice["text"]
    if advice["override"]:
        advised = chain.build(chain.compose([*ADVISED, advice["override"].strip("'")]))
        assert network(advised) == network(run) and network(run)[0] == 341_860
    else:
        assert "cannot be rebalanced without changing the network" in advice["text"] or "no cut" in advice["text"]


# --- where a step idles, by cause (chain.pipeline.idle) ------------------------------------------


def test_idle_splits_each_devices_span_into_busy_input_waits_overhead_and_tail():
    s = schedules.build("sequential", 2, 1)  # F(0) F(1) B(1) B(0)
    ev = [
        OpEvent("s0_F0/a", "MatMul", 0, 100, "vm"),
        OpEvent("s1_F0/a", "MatMul", 130, 200, "vm"),
        OpEvent("gradient_tape/s1_F0/a", "MatMul", 200, 300, "vm"),
        OpEvent("gradient_tape/s0_F0/a", "MatMul", 350, 400, "vm"),
    ]
    m = timeline.measure(s, ev, {1: (-20, 1000)}, ["/d:0", "/d:1"])
    out = idle.explain(m, s)
    got = [(d.busy_ms, d.input_wait_ms, d.overhead_ms, d.tail_ms) for d in out.devices]
    # device 0 waits for B(1) from 100 to 300 (input), then 50 more (overhead); device 1 waits for F(0)
    # until 100 (input), 30 more (overhead), and idles after its last action from 300 to 400 (tail)
    assert got == [pytest.approx(x) for x in ([150e-6, 200e-6, 50e-6, 0.0], [170e-6, 100e-6, 30e-6, 100e-6])]
    assert (out.head_ms, out.span_ms, out.finish_ms) == pytest.approx((20e-6, 400e-6, 600e-6))
    assert (out.replayed_span_ms, out.replayed_bubble_fraction) == pytest.approx((320e-6, 1 - 320 / 640))


@pytest.mark.parametrize("name", ["gpipe", "1f1b", "zb1", "interleaved", "zbv"])
def test_a_replay_with_unit_durations_is_the_plan_and_a_measured_step_adds_up_to_its_span(name):
    s = (
        schedules.build(name, 4, 4, 2 if name == "interleaved" else None)
        if name in ("interleaved", "zbv")
        else schedules.build(name, 3, 4)
    )
    plan = schedules.simulate(s)
    span, bubble = idle.step_and_bubble(s, {(k, kind): 1.0 for k in range(s.stages) for kind in "FBW"})
    assert (span, bubble) == pytest.approx((plan.slots, plan.bubble_fraction))
    durations = {"F": 1000, "B": 2000, "W": 700}  # unequal: each device's parts still sum to the span
    m = timeline.measure(
        s, synthetic(s, durations, gap=300), {7: (0, 10**9)}, [f"/d:{s.row(k)}" for k in range(s.stages)]
    )
    out = idle.explain(m, s)
    assert out.replayed_bubble_fraction < m.measured_bubble_fraction  # the slots' gaps are overhead
    for d in out.devices:
        assert d.busy_ms + d.input_wait_ms + d.overhead_ms + d.tail_ms == pytest.approx(out.span_ms)
    assert sum(d.overhead_ms for d in out.devices) > 0


def test_a_step_whose_call_compiled_the_step_function_is_kept_but_left_out_of_the_figures():
    """Its ops ran beside the tracing and compiling, and the first run of a function is slower: step 1 here takes
    ten times step 2's action times, and the per-stage figures are step 2's alone."""
    s = schedules.build("1f1b", 2, 2)
    slow = synthetic(s, {"F": 100, "B": 100}, step=(0, 10**5))
    fast = synthetic(s, {"F": 10, "B": 10}, step=(10**6, 10**6 + 10**4))
    steps, devices = {1: (0, 10**5), 2: (10**6, 10**6 + 10**4)}, ["/d:0", "/d:1"]
    m = timeline.measure(s, slow + fast, steps, devices, compiled=[1])
    assert [(step.step, step.complete) for step in m.steps] == [(1, False), (2, True)]
    alone = timeline.measure(s, fast, {2: steps[2]}, devices)
    # the same figures, but for the rounding of times counted from another origin (the first step's start)
    assert [p.forward_ms for p in m.per_stage] == pytest.approx([p.forward_ms for p in alone.per_stage], rel=1e-9)
    both = timeline.measure(s, slow + fast, steps, devices)  # the old figures: the compiled step averaged in
    assert all(b.forward_ms > 5 * a.forward_ms for a, b in zip(alone.per_stage, both.per_stage))


def two_stages_profiled(tmp_path, caplog, *overrides: str) -> dict:
    """timeline.json of a 2-stage e2e run at M=2 in `tmp_path` with `overrides`, its log in `caplog` (INFO)."""
    cfg = chain.compose(["+stages=2", "mode=e2e", "pipeline.microbatches=2", *SMALL, *overrides])
    with caplog.at_level(logging.INFO, logger="chain"):
        chain.build(cfg, run_dir=str(tmp_path)).fit()
    with open(tmp_path / "timeline.json") as f:
        return json.load(f)


def test_a_window_starting_at_the_first_one_step_call_names_its_compiled_step(tmp_path, caplog):
    """Calls 1-2 | 3 | 4 (`trainer.steps_per_call=2`): step 3 traces and compiles the one-step function in its
    call, as the first step of docs/measuring.md's window does; it stays in timeline.json, out of the figures."""
    measured = two_stages_profiled(
        tmp_path,
        caplog,
        "pipeline.schedule=1f1b",
        "trainer.steps=4",
        "trainer.steps_per_call=2",
        "trainer.profile=[3,4]",
    )
    assert [(step["step"], step["complete"]) for step in measured["steps"]] == [(3, False), (4, True)]
    said = [r.getMessage() for r in caplog.records if "compiled the step function" in r.getMessage()]
    assert len(said) == 1 and said[0].startswith("profile: step 3 traced and compiled"), said


def test_a_backwards_wait_for_its_gradient_is_not_busy():
    """A backward whose first ops need only its stage's own activations runs them as soon as it may, then waits
    for the gradient from the next stage: that wait is idle, not work on it."""
    s = schedules.build("sequential", 2, 1)  # F(0) F(1) B(1) B(0)
    ev = [
        OpEvent("s0_F0/a", "MatMul", 0, 100, "vm"),
        OpEvent("s1_F0/a", "MatMul", 100, 200, "vm"),
        OpEvent("gradient_tape/s1_F0/dx", "MatMul", 200, 250, "vm"),
        OpEvent("gradient_tape/s1_F0/dx/_1", "_Send", 250, 260, "vm"),  # its input gradient leaves
        OpEvent("gradient_tape/s1_F0/dw", "MatMul", 260, 400, "vm"),
        OpEvent("gradient_tape/s0_F0/gelu_grad", "Mul", 210, 220, "vm"),  # needs only stage 0's activations
        OpEvent("gradient_tape/s0_F0/dx", "MatMul", 270, 370, "vm"),  # once the gradient is there
    ]
    m = timeline.measure(s, ev, {1: (0, 1000)}, ["/d:0", "/d:1"])
    b0 = next(a for a in m.steps[0].actions if a.key() == (0, 0, "B", 0))
    assert (b0.start_ms, b0.end_ms) == pytest.approx((270e-6, 370e-6))
    assert m.per_stage[0].busy_ms == pytest.approx(200e-6)  # F 100 + B 100, not the 160 from its first op


def test_under_xla_the_log_says_why_no_step_is_measured(tmp_path, caplog):
    """An XLA-compiled action's ops carry no name scope in TensorFlow's trace: the run still trains and keeps
    the trace, and the log says why the measured timeline is empty rather than that steps were incomplete."""
    measured = two_stages_profiled(
        tmp_path, caplog, "trainer.jit_compile=true", "trainer.steps=3", "trainer.profile=[2,3]"
    )
    assert measured["steps"] and not any(s["complete"] for s in measured["steps"])
    assert "measured timeline: none under trainer.jit_compile=true" in caplog.text
    # the report says the same, not that the run was not profiled
    (note,) = page.measured_section(runs.load(str(tmp_path)), ["stage 0", "stage 1"])
    assert "profiled, but none under trainer.jit_compile=true" in note and "not profiled" not in note
