"""The command line, as a user runs it (each case a fresh process)."""

import os

import pytest

from conftest import read_summary, run_dirs
from messages import says


def test_main_job_three_stages_on_three_devices(cli, tmp_path):
    r = cli("+stages=3", "trainer.steps=50")
    assert r.returncode == 0, r.stderr
    assert "stage  device" in r.stdout and "/device:CPU:2" in r.stdout  # the placement table
    (run_dir,) = run_dirs(tmp_path)
    s = read_summary(run_dir)
    assert s["mode"] == "local" and s["steps"] == 50 and s["examples_per_second"] > 0
    # Each step's wait for its batch, over the calls after the first (6 calls of 8 steps, then 2).
    wait = s["data_wait_ms"]
    assert wait["steps"] == 42 and 0 <= wait["mean"] and 0 <= wait["p95"] and "data_wait_ms, 42 steps" in r.stdout
    devices = [st["device"] for st in s["stages"]]
    assert len(set(devices)) == 3
    for st in s["stages"]:
        assert st["variable_devices"] == [st["device"]]
        assert st["params"] > 0
        assert st["loss_last"] < st["loss_first"]
    for k in range(3):  # one checkpoint and one TensorBoard directory per stage
        assert os.listdir(os.path.join(run_dir, f"stage_{k:02d}"))
        assert os.listdir(os.path.join(run_dir, "tb", f"stage_{k:02d}"))
    assert os.listdir(os.path.join(run_dir, "tb", "chain"))


def test_device_override_from_the_command_line(cli, tmp_path):
    r = cli("+stages=3", "trainer.steps=3", "placement.devices=[/CPU:0,/CPU:0,/CPU:1]")
    assert r.returncode == 0, r.stderr
    s = read_summary(run_dirs(tmp_path)[0])
    assert [st["variable_devices"] for st in s["stages"]] == [["/device:CPU:0"], ["/device:CPU:0"], ["/device:CPU:1"]]


def test_heterogeneous_chain_from_the_command_line(cli, tmp_path):
    r = cli("+stages=[{model: conv},{model: {width: 16, depth: 1}, optim: sgd}]", "trainer.steps=3")
    assert r.returncode == 0, r.stderr
    assert "conv(filters=16" in r.stdout and "mlp(width=16, depth=1)" in r.stdout


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["+stages=0"], "stages=0 must be a positive integer"),
        (["+stages=-1"], "stages=-1 must be a positive integer"),
        (["model=transformer"], "model='transformer' is not known; allowed: builder, conv, gpt, keras, mlp"),
        (["optim=lion"], "optim='lion' is not known; allowed: adam, adamw, sgd, target"),
        (
            ["data=imagenet"],
            "data='imagenet' is not known; allowed: callable, csv, digits, keras, npz, synthetic, text, tfrecord, tokens",
        ),
        (["optim.lr=0"], "optim.lr=0 must be > 0"),
        (["data.batch_size=-4"], "data.batch_size=-4 must be >= 1"),
        (["+trainer.stepz=5"], "unknown key trainer.stepz"),
        (["placement.devices=[/CPU:0]"], "placement.devices has 1 entry, but there are 2 stages"),
        (
            ["placement.devices=[/CPU:0,/GPU:3]"],
            "placement.devices[1]='/GPU:3' does not exist; available: /device:CPU:0",
        ),
        (["+stages=3", "placement.devices=[/CPU:0,/CPU:1,/CPU:7]"], "placement.devices[2]='/CPU:7' does not exist"),
    ],
)
def test_bad_input_one_line_nonzero_exit_no_output(cli, tmp_path, overrides, message):
    r = cli(*overrides, "trainer.steps=2")
    assert r.returncode == 2
    lines = [line for line in r.stderr.splitlines() if line.strip()]
    assert lines == [f"error: {lines[0][len('error: ') :]}"] and says(lines[0], message), r.stderr
    assert "Traceback" not in r.stderr + r.stdout
    assert run_dirs(tmp_path) == [] and not os.path.exists(tmp_path / "outputs")  # nothing written at all
