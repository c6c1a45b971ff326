"""The precision and speed switches from the command line (each case a fresh process),
and bit-exact resume of a float16 run whose loss scale changes across the checkpoint."""

import os
import re

import numpy as np

from conftest import manifest, read_summary, run_cli, run_dirs, stage_values

QUIET = ["trainer.progress=false", "checkpoint.export=false"]


def test_bfloat16_from_the_command_line(cli, tmp_path):
    r = cli("+stages=3", "precision=mixed_bfloat16", "trainer.steps=30", "trainer.progress=false")
    assert r.returncode == 0, r.stderr
    (run_dir,) = run_dirs(tmp_path)
    s = read_summary(run_dir)
    assert s["precision"] == "mixed_bfloat16" and s["skipped_steps"] == 0
    for st in s["stages"]:
        assert st["loss_last"] < st["loss_first"]
        assert st["loss_scale"] is None and st["overflow_steps"] == 0  # bfloat16 needs no loss scale
    assert "chain.keras" in s["exports"]  # mixed-precision layers export too


def test_float16_with_overflow_steps_from_the_command_line(cli, tmp_path):
    # 2^22 overflows for the first few steps: with on_nan=stop (the default) they must
    # be skipped and the scale lowered, not stop the run.
    initial = 2**22
    r = cli(
        "+stages=3",
        "mode=e2e",
        "pipeline.microbatches=2",
        "precision=mixed_float16",
        f"trainer.initial_loss_scale={initial}",
        "trainer.steps=30",
        *QUIET,
    )
    assert r.returncode == 0, r.stderr
    s = read_summary(run_dirs(tmp_path)[0])
    assert s["precision"] == "mixed_float16" and s["skipped_steps"] == 0
    scales = {st["loss_scale"] for st in s["stages"]}
    overflows = {st["overflow_steps"] for st in s["stages"]}
    assert len(scales) == 1 and len(overflows) == 1  # one scale for the chain
    assert scales.pop() < initial and overflows.pop() >= 1
    assert s["loss_last"] < s["loss_first"]


def test_xla_from_the_command_line(cli, tmp_path):
    r = cli(
        "+stages=3",
        "mode=e2e",
        "pipeline.microbatches=2",
        "trainer.jit_compile=true",
        "trainer.steps=20",
        "placement.log_device_placement=true",
        *QUIET,
    )
    assert r.returncode == 0, r.stderr
    s = read_summary(run_dirs(tmp_path)[0])
    assert s["jit_compile"] is True and s["loss_last"] < s["loss_first"]
    # TensorFlow's placement log: each stage's compiled forward, gradient and update run on its device
    # (inside the loop of trainer.steps_per_call's steps, whose ops carry the while loop's prefix).
    for k in range(3):
        for scope, op in (
            (f"s{k}_F0", "StatefulPartitionedCall"),
            (f"s{k}_B0", "PartitionedCall"),
            (f"s{k}_update", "StatefulPartitionedCall"),
        ):
            assert re.search(rf"^while/body/_\d+/while/{scope}/{op}: \({op}\): \S*device:CPU:{k}$", r.stdout, re.M), (
                scope,
                r.stdout[-2000:],
            )


def test_grad_accum_from_the_command_line(cli, tmp_path):
    # 12 steps: two calls of trainer.steps_per_call=8 (8 + 4); the speed is timed from the second
    r = cli("+stages=2", "trainer.grad_accum=3", "trainer.steps=12", *QUIET)
    assert r.returncode == 0, r.stderr
    (run_dir,) = run_dirs(tmp_path)
    s = read_summary(run_dir)
    assert (s["grad_accum"], s["batch_size"], s["examples_per_step"]) == (3, 64, 192)
    assert s["steps"] == 12 and s["examples_per_second"] > 0
    for k in range(2):  # trainer.steps counts optimizer updates, not batches of data.batch_size
        values = stage_values(run_dir, f"stage_{k:02d}")
        assert int(values["optimizer/_iterations/.ATTRIBUTES/VARIABLE_VALUE"]) == 12


def test_more_examples_per_step_than_the_data_set_is_one_line(cli, tmp_path):
    r = cli("trainer.grad_accum=100", "trainer.steps=2")
    assert r.returncode == 2
    lines = [line for line in r.stderr.splitlines() if line.strip()]
    assert lines == [
        "error: trainer.grad_accum=100 x data.batch_size=64 = 6400 examples per step is more than "
        "data=digits has (1617 training examples)"
    ], r.stderr
    assert run_dirs(tmp_path) == []


def test_float16_resume_after_kill_is_bit_exact_with_the_loss_scale(tmp_path):
    """The loss scale starts at 2^24 and overflows, halving, during about the first six
    steps; the checkpoint at step 3 is in the middle of that. A resume that lost the scale
    would start again from 2^24 and skip steps the uninterrupted run trains on."""
    n, every, kill_at = 10, 3, 5
    initial = 2**24
    args = [
        "mode=e2e",
        "+stages=2",
        "model.width=16",
        "model.dropout=0.2",
        "data.batch_size=32",
        "pipeline.microbatches=2",
        "precision=mixed_float16",
        f"trainer.initial_loss_scale={initial}",
        f"trainer.steps={n}",
        f"checkpoint.every={every}",
        *QUIET,
    ]
    straight, resumed = str(tmp_path / "straight"), str(tmp_path / "resumed")
    r = run_cli(tmp_path, *args, f"hydra.run.dir={straight}")
    assert r.returncode == 0, r.stderr
    r = run_cli(tmp_path, *args, f"hydra.run.dir={resumed}", env={"CHAIN_TEST_KILL_AT_STEP": str(kill_at)})
    assert r.returncode == -9, r.stderr
    at_checkpoint = stage_values(resumed, "stage_01")
    assert manifest(resumed)["step"] == every and manifest(resumed)["precision"] == "mixed_float16"
    r = run_cli(tmp_path, *args, f"hydra.run.dir={resumed}", "resume=true")
    assert r.returncode == 0, r.stderr

    scale_key = "loss_scale/scale/.ATTRIBUTES/VARIABLE_VALUE"
    overflow_key = "loss_scale/overflows/.ATTRIBUTES/VARIABLE_VALUE"
    assert 1 <= at_checkpoint[overflow_key] and at_checkpoint[scale_key] < initial  # saved mid-descent
    for k in range(2):
        a, b = stage_values(straight, f"stage_{k:02d}"), stage_values(resumed, f"stage_{k:02d}")
        assert set(a) == set(b) and scale_key in a
        for key in a:
            assert a[key].dtype == b[key].dtype and np.array_equal(a[key], b[key]), (k, key)
        assert a[overflow_key] > at_checkpoint[overflow_key]  # the scale kept falling after the checkpoint
        iterations = int(a["optimizer/_iterations/.ATTRIBUTES/VARIABLE_VALUE"])
        assert iterations + int(a[overflow_key]) == n and iterations >= 2  # every step: an update or an overflow
    s, t = read_summary(straight), read_summary(resumed)
    assert t["resumed_from"] == every
    assert (t["loss_first"], t["loss_last"]) == (s["loss_first"], s["loss_last"])
    assert [st["loss_scale"] for st in t["stages"]] == [st["loss_scale"] for st in s["stages"]]
    # A float16 checkpoint does not resume as float32 (it holds loss scales), and says so.
    r = run_cli(
        tmp_path,
        *[a for a in args if not a.startswith("precision=")],
        "trainer.steps=11",
        f"hydra.run.dir={resumed}",
        "resume=true",
    )
    assert r.returncode == 2
    assert r.stderr.strip().startswith(
        "error: the checkpoint was written with precision=mixed_float16, the config has precision=float32"
    )
    assert os.path.exists(os.path.join(resumed, "summary.json"))
