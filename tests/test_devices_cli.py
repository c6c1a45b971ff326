"""Device control from the command line (each case a fresh process with its own logical devices)."""

import os
import re

import pytest

from conftest import read_summary, run_dirs


def test_mirrored_trains_over_two_replicas_and_loss_falls(cli, tmp_path):
    r = cli("+stages=3", "placement.fallback=mirrored", "trainer.steps=60")
    assert r.returncode == 0, r.stderr
    assert re.search(r"replica\s+device\s+physical", r.stdout) and "all 2 replicas" in r.stdout
    assert "(MatMul)" not in r.stdout  # no op placement log unless asked for
    (run_dir,) = run_dirs(tmp_path)
    s = read_summary(run_dir)
    assert s["mode"] == "local" and s["strategy"] == "mirrored"
    assert s["replica_devices"] == ["/device:CPU:0", "/device:CPU:1"]
    assert s["batch_size"] == 2 * s["per_replica_batch_size"]
    assert len(s["stages"]) == 3
    for st in s["stages"]:
        assert st["variable_devices"] == s["replica_devices"]  # every stage on every replica
        assert st["loss_last"] < st["loss_first"]
    for k in range(3):  # checkpoints and TensorBoard per stage, as in a pipelined run
        assert os.listdir(os.path.join(run_dir, f"stage_{k:02d}"))


def test_mirrored_e2e_trains_the_composed_chain(cli, tmp_path):
    r = cli("+stages=3", "mode=e2e", "placement.fallback=mirrored", "pipeline.microbatches=2", "trainer.steps=40")
    assert r.returncode == 0, r.stderr
    assert "pipeline.microbatches=2 ignored" in r.stdout and "schedule:" not in r.stdout
    s = read_summary(run_dirs(tmp_path)[0])
    assert s["mode"] == "e2e" and s["strategy"] == "mirrored" and "schedule" not in s
    assert s["loss_last"] < s["loss_first"]
    assert len(s["replica_peak_memory_bytes"]) == 2


def test_pipelined_summary_records_its_strategy(cli, tmp_path):
    r = cli("trainer.steps=2", "placement.log_device_placement=true")
    assert r.returncode == 0, r.stderr
    assert read_summary(run_dirs(tmp_path)[0])["strategy"] == "pipeline"
    # TensorFlow's placement log: stage 1's forward pass runs on stage 1's device.
    assert re.search(r"stage_01\S*/MatMul: \(MatMul\): \S*device:CPU:1", r.stdout), r.stdout[-2000:]


@pytest.mark.parametrize(
    "overrides, message",
    [
        (
            ["+stages=3", "placement.memory_limit_mb=[100,200]"],
            "placement.memory_limit_mb has 2 entries, but there are 3 stages",
        ),
        (["placement.visible=[0]"], "placement.visible[0]=0: no such GPU; TensorFlow sees no GPU"),
        (
            ["+stages=3", "placement.fallback=mirrored", "data.batch_size=63"],
            "data.batch_size=63 does not divide over 2 replicas (placement.replicas)",
        ),
        (["placement.fallback=error"], "placement.fallback=error: 2 stages need 2 GPUs, 0 visible"),
        (["placement.replicas=0"], "placement.replicas=0 must be >= 1"),
    ],
)
def test_bad_device_input_one_line_exit_2_no_run_dir(cli, tmp_path, overrides, message):
    r = cli(*overrides, "trainer.steps=2")
    assert r.returncode == 2
    lines = [line for line in r.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0], r.stderr
    assert "Traceback" not in r.stderr + r.stdout
    assert run_dirs(tmp_path) == []
