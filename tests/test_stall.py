"""trainer.stall_s: a step that stops moving says where it waits, from the markers each action leaves
on its device's host (`chain.pipeline.progress`), in the names the step gives its actions; stall_action=stop
ends the run with one line and exit 7. A step held by the test hook (`CHAIN_TEST_HOLD`) is found
in GPipe and 1F1B (and on cluster workers: tests/test_cluster.py); steps that do not stall print
nothing of it."""

from __future__ import annotations

import logging
import os
import time

import pytest

from chain.schedule import schedules
from chain.pipeline.progress import Progress
from chain.pipeline.stalled import ANSWER_S, Position, decode, stride, where
from chain.training.stall import StallWatch
from conftest import EXTENDED, read_summary, run_cli

TINY = [
    "+stages=3",
    "mode=e2e",
    "pipeline.microbatches=4",
    "model.width=16",
    "data.batch_size=32",
    "trainer.steps=5",
    "trainer.progress=false",
    "checkpoint.export=false",
    "trainer.stall_s=1",
]
DEVICES = ["/device:CPU:0", "/device:CPU:1", "/device:CPU:2"]


def report(out: str) -> list[str]:
    """The lines of the stall report in the run's log (its header, the grid, a line per device)."""
    lines = out.splitlines()
    start = [i for i, line in enumerate(lines) if "no step completed for" in line]
    assert len(start) == 1, out  # one report per stall
    return lines[start[0] : start[0] + 7]


def test_the_markers_read_back_name_each_devices_last_action_and_what_it_waits_for():
    s = schedules.gpipe(3, 4)
    unit = stride(s, 1)
    # step 5 begun: stage 0 finished 4 actions, stage 1 two, stage 2 two; a marker left from step 4 is 0
    assert decode(5, [5 * unit + 4, 5 * unit + 2, 4 * unit + 8], s, 1) == Position(5, (4, 2, 0))
    lines = where(s, 1, DEVICES, Position(5, (4, 2, 2)))
    assert lines[0].split() == [
        "stage",
        "0",
        "/device:CPU:0",
        "F0",
        "F1",
        "F2",
        "F3",
        ".",
        ".",
        ".",
        ".",
        ">B0",
        "B1",
        "B2",
        "B3",
    ]
    assert lines[3:] == [
        "stage 0: finished s0_F3; waits in s0_B0 for s1_B0 (stage 1)",
        "stage 1: finished s1_F1; in s1_F2, which has every input: the wait is inside it",
        "stage 2: finished s2_F1; waits in s2_F2 for s1_F2 (stage 1)",
    ]
    # two rounds (trainer.grad_accum=2): microbatches numbered over both, the grid shows one round
    lines = where(s, 2, DEVICES, Position(1, (8, 8, 8)))
    assert all(">F0" in line.split() for line in lines[:3])
    assert lines[3:5] == [
        "stage 0: finished s0_B3; in s0_F4 (round 2 of 2), which has every input: the wait is inside it",
        "stage 1: finished s1_B3; waits in s1_F4 (round 2 of 2) for s0_F4 (stage 0)",
    ]
    assert where(s, 1, DEVICES, Position(1, (0, 0, 8)))[3:] == [
        "stage 0: finished nothing of this step yet; in s0_F0, which has every input: the wait is inside it",
        "stage 1: finished nothing of this step yet; waits in s1_F0 for s0_F0 (stage 0)",
        "stage 2: finished every action (s2_B3 last)",
    ]


def test_interleaved_stages_and_copies_of_the_pipeline_are_named_as_their_devices():
    lines = where(schedules.interleaved(4, 2, 2), 1, ["a", "b", "a", "b"], Position(3, (3, 3)))
    assert lines[0].split()[:6] == ["device", "0", "(stages", "0,", "2)", "a"] and ">F1@s2" in lines[0].split()
    assert lines[2:] == [
        "device 0 (stages 0, 2): finished s2_F0; in s2_F1, which has every input: the wait is inside it",
        "device 1 (stages 1, 3): finished s3_F0; waits in s3_F1 for s2_F1 (device 0: stages 0, 2)",
    ]
    lines = where(schedules.one_f_one_b(2, 2), 1, ["a", "b", "c", "d"], Position(1, (4, 4, 3, 2)), replicas=2)
    assert lines[4:] == [
        "copy 0 stage 0: finished every action (s0_B1 last)",
        "copy 0 stage 1: finished every action (s1_B1 last)",
        "copy 1 stage 0: finished r1_s0_B0; waits in r1_s0_B1 for r1_s1_B1 (copy 1 stage 1)",
        "copy 1 stage 1: finished r1_s1_B0; in r1_s1_F1, which has every input: the wait is inside it",
    ]


class _Hanging:
    """A marker whose process never answers (a stopped worker)."""

    def numpy(self):
        time.sleep(3600)


def test_a_row_whose_marker_does_not_answer_is_named_and_the_others_are_read():
    s = schedules.one_f_one_b(2, 2)
    progress = Progress(s, 1, "/device:CPU:0", ["/device:CPU:0", "/device:CPU:0"])
    progress.started.assign(3)
    progress.markers[0].assign(3 * stride(s, 1) + 2)
    progress.markers[1] = _Hanging()
    started = time.monotonic()
    assert progress.read(answer_s=0.3) == Position(3, (2, None))
    assert time.monotonic() - started < 2
    assert where(s, 1, DEVICES[:2], Position(3, (2, None)))[2:] == [
        "stage 0: finished s0_F1; waits in s0_B0 for s1_B0 (stage 1)",
        f"stage 1: its marker did not answer within {ANSWER_S:g} s (its process is stopped, or busy inside one op)",
    ]


class _Markers:
    """A strategy as the watch sees it: markers it can read (`started`: steps begun), or none."""

    def __init__(self, markers: bool):
        self.markers, self.started = markers, 0

    def position(self):
        return Position(self.started, (0, 0)) if self.markers else None

    def steps_begun(self):
        return self.started if self.markers else None

    def waiting(self, position):
        return [f"where step {position.started} waits"]


def watched(strategy, seconds: float, first: int, n: int, wait: float, fresh: bool = False, begin=None) -> str:
    """What the watch logs while a call of `n` steps from `first` runs `wait` seconds (`begin` runs
    after the call began: a step begins); `fresh`: the call's function has not run before."""
    watch = StallWatch(seconds, False, strategy, lambda: "no checkpoint had been saved")
    messages: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: messages.append(record.getMessage())
    logging.getLogger("chain").addHandler(handler)
    try:
        watch.start()
        if not fresh:
            watch.end(n)  # a call of this kind ran before
        watch.begin(first, n)
        time.sleep(0.05)
        if begin:
            begin()
        time.sleep(wait)
        watch.end(n)
    finally:
        watch.stop()
        logging.getLogger("chain").removeHandler(handler)
    return "\n".join(messages)


def test_a_step_without_markers_is_reported_after_its_call_ran_n_times_stall_s():
    # mode=local and mirrored steps leave no markers: the watch sees only the call; a call of 2 steps
    # may run 2 x stall_s
    assert watched(_Markers(False), 0.3, 7, 2, 0.4) == ""
    said = watched(_Markers(False), 0.3, 7, 2, 0.9)
    assert "no step completed for" in said and "step 7 has not completed (a call of steps 7..8)" in said
    assert watched(_Markers(False), 0.3, 7, 2, 0.9, fresh=True) == ""  # tracing and compiling: not watched


def test_a_fresh_call_is_watched_from_its_first_step_begun():
    strategy = _Markers(True)

    def begins():
        strategy.started = 1

    assert watched(strategy, 0.3, 1, 1, 0.6, fresh=True) == ""  # nothing begun: still tracing
    said = watched(strategy, 0.3, 1, 1, 0.6, fresh=True, begin=begins)
    assert said.count("no step completed") == 1 and "step 1 waits" in said and "where step 1 waits" in said


@pytest.mark.parametrize(
    "schedule, per_call, held, lines",
    [
        (
            "gpipe",
            2,
            "s1_F2",
            [
                "stage 0: finished s0_F3; waits in s0_B0 for s1_B0 (stage 1)",
                "stage 1: finished s1_F1; in s1_F2, which has every input: the wait is inside it",
                "stage 2: finished s2_F1; waits in s2_F2 for s1_F2 (stage 1)",
            ],
        ),
        pytest.param(  # the suite's time: gpipe's held action runs every time, 1f1b's stop below
            "1f1b",
            1,
            "s1_F2",
            [
                "stage 0: finished s0_F3; waits in s0_B1 for s1_B1 (stage 1)",
                "stage 1: finished s1_B0; in s1_F2, which has every input: the wait is inside it",
                "stage 2: finished s2_B1; waits in s2_F2 for s1_F2 (stage 1)",
            ],
            marks=EXTENDED,
        ),
        # one microbatch: the actions are not chained, and the markers wait on their last results
        (
            "gpipe pipeline.microbatches=1",
            1,
            "s1_B0",
            [
                "stage 0: finished s0_F0; waits in s0_B0 for s1_B0 (stage 1)",
                "stage 1: finished s1_F0; in s1_B0, which has every input: the wait is inside it",
                "stage 2: finished every action (s2_B0 last)",
            ],
        ),
    ],
)
def test_a_held_action_is_named_in_the_report_and_the_run_goes_on(tmp_path, schedule, per_call, held, lines):
    """An action of stage 1 held for 2 s in step 3 (of 6): one report, naming
    it, and nothing about the other steps (the first call traces, a call of 2 steps shows each step
    begin); the run then ends as usual (stall_action=report)."""
    r = run_cli(
        tmp_path,
        *TINY,
        f"pipeline.schedule={schedule.split()[0]}",
        *schedule.split()[1:],
        f"trainer.steps_per_call={per_call}",
        "trainer.steps=6",
        f"hydra.run.dir={tmp_path / 'run'}",
        env={"CHAIN_TEST_HOLD": f"{held}@3,2"},
    )
    assert r.returncode == 0, r.stderr
    said = report(r.stdout)
    assert (
        "no step completed for 1 s (trainer.stall_s=1): step 3 waits; still waiting "
        "(trainer.stall_action=report)" in said[0]
    )
    assert said[2].split()[:3] == ["stage", "1", "/device:CPU:1"] and f">{held[3:]}" in said[2].split()
    assert said[4:] == lines
    assert r.stderr == f"test-hook: holding {held} in step 3\n"
    assert read_summary(tmp_path / "run")["steps"] == 6


def test_stall_action_stop_ends_the_run_with_one_line_and_exit_7(tmp_path):
    run_dir = tmp_path / "run"
    r = run_cli(
        tmp_path,
        *TINY,
        "pipeline.schedule=1f1b",
        "checkpoint.every=2",
        "trainer.stall_action=stop",
        f"hydra.run.dir={run_dir}",
        env={"CHAIN_TEST_HOLD": "s1_F2@3"},
    )
    assert r.returncode == 7, r.stderr
    assert "stopping (trainer.stall_action=stop)" in report(r.stdout)[0]
    errors = [line for line in r.stderr.splitlines() if line.startswith("error:")]
    assert errors == [
        "error: step 3 stalled: no step completed for 1 s (trainer.stall_s=1, trainer.stall_action="
        "stop); the last complete checkpoint (step 2) is intact: resume with resume=true"
    ]
    assert r.stderr.rstrip().endswith(errors[0])
    assert not os.path.exists(run_dir / "summary.json")


def test_a_resume_may_change_or_add_the_stall_settings_without_a_word():
    """They are the watch, not the math: a checkpoint written with others, or before they existed, resumes."""
    import chain
    from chain.config import validate
    from chain.state.run_settings import RunSettings, check_resume

    settings = validate(chain.compose(["mode=e2e", "+stages=2"]))
    saved = RunSettings.of(settings).values
    older = {**saved, "trainer": {k: v for k, v in saved["trainer"].items() if not k.startswith("stall_")}}
    changed = validate(chain.compose(["mode=e2e", "+stages=2", "trainer.stall_s=0", "trainer.stall_action=stop"]))
    for record in (saved, older):
        assert check_resume(RunSettings(record), changed, 3) == []
