"""Schedules from a file (`pipeline.schedule=file`): every built-in schedule written out reads back as
itself, and a file that cannot run is refused before training with the action that can never run."""

import json

import pytest

import chain
from chain.schedule import schedule_file, schedules
from chain.schedule.schedules import Action
from conftest import run_cli

SIZES = [(1, 1), (2, 4), (3, 2), (4, 8)]
BASE = [
    "+stages=3",
    "mode=e2e",
    "model.depth=1",
    "model.width=8",
    "data=synthetic",
    "data.features=6",
    "data.samples=64",
    "data.batch_size=8",
    "pipeline.microbatches=2",
]


@pytest.mark.parametrize("name", schedules.NAMES)
def test_every_built_in_schedule_reads_back_from_its_file_as_itself(name):
    shared = {"interleaved": [(2, 2), (4, 4), (6, 6)], "zbv": [(2, 1), (4, 4), (6, 3)]}  # M a multiple of the devices;
    for k, m in shared.get(name, SIZES):  # zbv: an even number of stages
        s = schedules.build(name, k, m, k // 2 if name == "interleaved" else None)
        back = schedule_file.loads(schedule_file.dumps(s), k, m)
        assert back.actions == s.actions and (back.stages, back.microbatches) == (k, m)
        assert back.stage_rows == s.stage_rows
        assert schedules.simulate(back).grid == schedules.simulate(s).grid


def test_the_file_has_one_row_per_device_one_action_per_cell():
    assert schedule_file.dumps(schedules.build("1f1b", 2, 2)) == "F0,F1,B0,B1\nF0,B0,F1,B1\n"


def test_cells_may_name_their_stage_and_torch_form_reads_too():
    # Blank cells (a grid's idle slots) are skipped; `2F0` is torch's stage-first form, `I` its input half.
    text = "0F0,, F1@s0 ,0B0,0I1\n,1F0,F1,1B0,B1\n"
    s = schedule_file.loads(text, 2, 2)
    assert s.actions == schedules.build("1f1b", 2, 2).actions[:1] + (
        (Action(1, 0, "F"), Action(1, 1, "F"), Action(1, 0, "B"), Action(1, 1, "B")),
    )


ONE_F_ONE_B = "F0,F1,B0,B1\nF0,B0,F1,B1\n"  # 2 stages, 2 microbatches


@pytest.mark.parametrize(
    "text, message",
    [
        ("F0,F1,B0\nF0,B0,F1,B1\n", "row 1 never runs B1@s0"),
        ("F0,F1,B0,B1,B1\nF0,B0,F1,B1\n", "row 1, cell 5: B1@s0 runs twice (cells 4 and 5)"),
        # Row 1 waits in B0 for stage 1's B0; stage 1 first waits in F1 for stage 0's F1, which comes after B0.
        (
            "F0,B0,F1,B1\nF0,F1,B0,B1\n",
            "deadlock at slot 2; B0 of stage 0 (its action 2) can never run: it needs "
            "B0 of stage 1, which stage 1 runs only after F1, itself waiting",
        ),
        ("F0,F1,B0,B1\nB0,F0,F1,B1\n", "stage 1 runs B0 before F0"),
        ("F0,F1,B0,B1\n", "no row runs stage 1"),
        (
            "F0,F1,B0,B1\nF0,B0,F1,B1\nF0\n",
            "has more than 2 rows, but the chain has 2 stages: one row per device, at most 2",
        ),
        (
            "F0,F1,B0,B1\nF0,B0,F1,B1,F2\n",
            "row 2, cell 5: F2@s1: microbatch 2, but pipeline.microbatches=2 numbers them 0..1",
        ),
        ("F0,F1,B0,X1\nF0,B0,F1,B1\n", "row 1, cell 4: 'X1' is not an action"),
        ("F0,F1,B0,B1\nF0,B0,F1,B1@s0\n", "row 2, cell 4: B1@s0: stage 0 is on row 1's device already"),
        ("F0,F1,B0,B1,W0,W1\nF0,B0,F1,B1\n", "row 2 never runs W0@s1 (a W anywhere splits every backward"),
    ],
)
def test_a_file_that_cannot_run_is_refused_with_what_is_wrong(text, message):
    with pytest.raises(schedule_file.ScheduleFileError) as e:
        schedule_file.loads(text, 2, 2)
    assert message in str(e.value) and "\n" not in str(e.value)


def test_a_split_schedule_runs_w_after_its_b():
    text = "F0,F1,B0,W0,B1,W1\nF0,B0,W1,F1,B1,W0\n"
    with pytest.raises(schedule_file.ScheduleFileError, match="stage 1 runs W1 before B1"):
        schedule_file.loads(text, 2, 2)


def test_the_config_refuses_a_bad_file_in_one_line_naming_the_key(tmp_path):
    path = tmp_path / "s.csv"
    path.write_text("F0,B0,F1,B1\nF0,B0,F1,B1\nF0,F1,B0,B1\n")
    with pytest.raises(chain.ConfigError) as e:
        chain.compose(BASE + ["pipeline.schedule=file", f"pipeline.schedule_file={path}"])
    assert str(e.value).startswith(f"pipeline.schedule_file={str(path)!r} deadlock") and "\n" not in str(e.value)
    for overrides, message in [
        (
            ["pipeline.schedule=file"],
            "pipeline.schedule=file reads the schedule from pipeline.schedule_file, which is not set",
        ),
        (["pipeline.schedule=file", f"pipeline.schedule_file={tmp_path}/none.csv"], "the file does not exist"),
        (
            [f"pipeline.schedule_file={path}"],
            "pipeline.schedule_file is read only with pipeline.schedule=file (is gpipe)",
        ),
        (["pipeline.schedule_out=x.csv"], "pipeline.schedule_out is written by plan_only=true"),
        (["plan_only=true", f"pipeline.schedule_out={tmp_path}/no/x.csv"], "the folder"),
    ]:
        with pytest.raises(chain.ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
            chain.compose(BASE + overrides)


def test_the_command_line_refuses_a_bad_file_with_one_line_and_exit_2(tmp_path):
    (tmp_path / "s.csv").write_text("F0,F1,B0\nF0,B0,F1,B1\nF0,B0,F1,B1\n")
    r = run_cli(tmp_path, *BASE, "pipeline.schedule=file", "pipeline.schedule_file=s.csv")
    assert r.returncode == 2
    assert r.stderr.strip() == "error: pipeline.schedule_file='s.csv' row 1 never runs B1@s0", r.stderr
    assert not (tmp_path / "outputs").exists()


@pytest.mark.parametrize(
    "cell, message",
    [
        (
            "F" * (1 << 20),
            "line 2 holds a cell of more than 131072 characters; a cell is F3, B3 or W3",
        ),  # past csv's limit
        (
            "F" + "1" * 5000,
            "row 2, cell 4: 'F11111111111'... (5001 characters) is not an action",
        ),  # past int()'s digits
        ("F1@s" + "1" * 5000, "row 2, cell 4: 'F1@s11111111'... (5004 characters) is not an action"),
    ],
)
def test_a_file_under_the_size_limit_with_a_huge_cell_is_one_line(tmp_path, cell, message):
    path = tmp_path / "s.csv"
    path.write_text(f"F0,F1,B0,B1\nF0,B0,F1,{cell}\n")
    assert path.stat().st_size < schedule_file.MAX_BYTES
    with pytest.raises(chain.ConfigError) as e:
        chain.compose(BASE + ["pipeline.schedule=file", f"pipeline.schedule_file={path}"])
    assert str(e.value).startswith(f"pipeline.schedule_file={str(path)!r} {message}") and len(str(e.value)) < 300
    assert "\n" not in str(e.value)


def test_a_file_just_over_the_size_limit_is_refused_before_it_is_parsed(tmp_path, monkeypatch):
    path = tmp_path / "s.csv"
    path.write_bytes(ONE_F_ONE_B.encode() + b"\n" * (schedule_file.MAX_BYTES + 1 - len(ONE_F_ONE_B)))
    monkeypatch.setattr(schedule_file, "loads", lambda *a: pytest.fail("parsed"))
    with pytest.raises(
        schedule_file.ScheduleFileError, match=r"^is larger than 16 MiB; a schedule file is a few lines$"
    ):
        schedule_file.read(str(path), 2, 2)
    path.write_bytes(path.read_bytes()[:-1])  # exactly at the limit: read and parsed
    monkeypatch.undo()
    assert schedule_file.read(str(path), 2, 2).actions == schedules.build("1f1b", 2, 2).actions
    path.write_bytes(ONE_F_ONE_B.replace("\n", "\n" * (schedule_file.MAX_BYTES - 40), 1).encode())  # blank lines inside
    with pytest.raises(schedule_file.ScheduleFileError, match=r"^has more than 2 rows, but the chain has 2 stages"):
        schedule_file.read(str(path), 2, 2)


def test_the_report_reads_a_schedule_file_runs_summary_and_its_schedule(tmp_path):
    """A pipeline.schedule=file run's summary.json names `file`: the report takes it and reads the schedule back."""
    from chain.report import runs

    path = tmp_path / "zb1.csv"
    schedule_file.write(schedules.build("zb1", 2, 2), str(path))
    summary = {
        "schedule": "file",
        "schedule_file": str(path),
        "microbatches": 2,
        "bubble_fraction": 0.2,
        "batch_size": 4,
    }
    (tmp_path / "summary.json").write_text(json.dumps({**summary, "stages": [{"index": 0}, {"index": 1}]}))
    assert runs.load(str(tmp_path)).schedule().actions == schedules.build("zb1", 2, 2).actions
