"""mode=e2e from the command line (each case a fresh process with its own logical devices)."""

import re

from conftest import read_summary, run_dirs

E2E = ["+stages=4", "mode=e2e", "pipeline.schedule=1f1b", "pipeline.microbatches=8", "data.batch_size=64"]


def test_1f1b_pipeline_trains_and_its_loss_falls(cli, tmp_path):
    r = cli(*E2E, "trainer.steps=20", "trainer.progress=false")
    assert r.returncode == 0, r.stderr
    assert "schedule: 1f1b, 8 microbatches, bubble fraction 0.273" in r.stdout
    (run_dir,) = run_dirs(tmp_path)
    s = read_summary(run_dir)
    assert (s["mode"], s["schedule"], s["microbatches"], s["steps"]) == ("e2e", "1f1b", 8, 20)
    assert s["bubble_fraction"] == 3 / 11  # (K-1)/(M+K-1), from the schedule's own timeline
    assert s["loss_last"] < s["loss_first"]
    assert [st["device"] for st in s["stages"]] == [f"/device:CPU:{k}" for k in range(4)]
    for st in s["stages"]:
        assert st["variable_devices"] == [st["device"]] and st["params"] > 0
        assert "peak_memory_bytes" in st


def test_plan_only_prints_the_timeline_and_trains_nothing(cli, tmp_path):
    r = cli(*E2E, "plan_only=true")
    assert r.returncode == 0, r.stderr
    assert "stage  device" in r.stdout  # the placement table
    rows = [line for line in r.stdout.splitlines() if re.match(r"stage \d  /device:CPU:\d  ", line)]
    assert len(rows) == 4
    cells = [row.split("  ", 2)[2].split() for row in rows]
    # One column per slot: 2(M+K-1) = 22 slots, each device busy in 2M = 16 of them.
    assert all(len(c) <= 22 for c in cells) and max(len(c) for c in cells) == 22
    assert all(sum(x != "." for x in c) == 16 for c in cells)
    assert cells[0][:4] == ["F0", "F1", "F2", "F3"] and cells[3][:5] == [".", ".", ".", "F0", "B0"]
    assert "bubble fraction: 0.273" in r.stdout
    # Each stage's memory estimate next to its device (issue 21): 1F1B holds 4, 3, 2, 1 microbatches.
    for k, held in enumerate([4, 3, 2, 1]):
        s = "es" if held > 1 else ""
        assert re.search(
            rf"^  stage {k}: [\d.]+ [KMG]?B \(weights .*activations [\d.]+ [KMG]?B \({held} microbatch{s} "
            rf"held\), inputs .*\); /device:CPU:{k}: shares the host's memory$",
            r.stdout,
            re.M,
        ), r.stdout
    assert "all stages: " in r.stdout and "logical CPU devices share one allocator" in r.stdout
    assert run_dirs(tmp_path) == []
    assert "done:" not in r.stdout


def test_microbatches_that_do_not_divide_the_batch_are_one_line_and_exit_2(cli, tmp_path):
    r = cli("+stages=2", "mode=e2e", "pipeline.microbatches=3", "data.batch_size=64")
    assert r.returncode == 2
    lines = [line for line in r.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: pipeline.microbatches=3 does not divide data.batch_size=64")
    assert "Traceback" not in r.stderr + r.stdout
    assert run_dirs(tmp_path) == []
