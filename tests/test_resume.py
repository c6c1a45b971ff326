"""Resume after `kill -9`, saves killed half-way, and the NaN guard, as a user meets them.

Every run is a fresh `python -m chain` process; the fault-injection hooks are the
environment variables of `chain.testhooks` (for tests only).
"""

import glob
import os
import re
import shutil
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

from conftest import EXTENDED, manifest, read_summary, run_cli, stage_values

# Each entry: how the chain is trained (the pipelined modes, and the mirrored fallback).
MODES = {
    "local": ["mode=local"],
    "e2e": ["mode=e2e", "pipeline.schedule=1f1b", "pipeline.microbatches=2"],
    "mirrored": ["mode=local", "placement.fallback=mirrored"],
    # 4 stages in a V on 2 devices, split backwards (the later "+stages=4" wins over TINY's 2)
    "e2e-zbv": ["mode=e2e", "pipeline.schedule=zbv", "pipeline.microbatches=4", "+stages=4"],
}
# Dropout > 0: a resume that lost the seed generators' state would differ from step 1 on.
TINY = ["+stages=2", "model.width=16", "model.dropout=0.2", "data.batch_size=32", "trainer.progress=false"]


def cli(cwd, *overrides, env=None):
    return run_cli(cwd, *overrides, env=env)


def event_steps(path) -> list[int]:
    return sorted(e.step for e in tf.compat.v1.train.summary_iterator(path) if e.summary.value)


# The suite's time: e2e (1f1b) and mirrored run every time, and mode=local's kill and resume is every run's of
# test_streaming's killed stream; zbv (4 stages, split backwards) is another schedule of the same e2e resume.
EXTENDED_MODES = {"local", "e2e-zbv"}


@pytest.mark.parametrize("mode", [pytest.param(m, marks=EXTENDED if m in EXTENDED_MODES else ()) for m in MODES])
def test_resume_after_kill_is_bit_exact(tmp_path, mode):
    n, every, kill_at = 8, 3, 5  # killed two steps after the checkpoint at step 3
    args = [*TINY, *MODES[mode], f"trainer.steps={n}", f"checkpoint.every={every}", "trainer.log_every=1"]
    n_stages = 4 if "+stages=4" in MODES[mode] else 2
    straight, resumed = str(tmp_path / "straight"), str(tmp_path / "resumed")
    r = cli(tmp_path, *args, f"hydra.run.dir={straight}")
    assert r.returncode == 0, r.stderr
    r = cli(tmp_path, *args, f"hydra.run.dir={resumed}", env={"CHAIN_TEST_KILL_AT_STEP": str(kill_at)})
    assert r.returncode == -9, r.stderr  # SIGKILL: no cleanup ran
    assert manifest(resumed)["step"] == every and not os.path.exists(os.path.join(resumed, "summary.json"))
    before = set(glob.glob(os.path.join(resumed, "tb", "chain", "*")))
    r = cli(tmp_path, *args, f"hydra.run.dir={resumed}", "resume=true")
    assert r.returncode == 0, r.stderr

    for k in range(n_stages):
        a, b = stage_values(straight, f"stage_{k:02d}"), stage_values(resumed, f"stage_{k:02d}")
        assert set(a) == set(b)
        assert any(key.startswith("random/") for key in a)  # dropout seed state is in the checkpoint
        assert sum(key.startswith("optimizer/_variables/") for key in a) >= 4  # Adam's slots too
        for key in a:
            assert a[key].dtype == b[key].dtype and np.array_equal(a[key], b[key]), (k, key)
    s, t = read_summary(straight), read_summary(resumed)
    assert t["resumed_from"] == every and t["steps"] == n
    for key in ("loss_first", "loss_last"):  # the chain's (e2e) or the sum's (local), and each stage's
        assert t[key] == s[key] and t[key] is not None
        assert [st.get(key) for st in t["stages"]] == [st.get(key) for st in s["stages"]]
    # TensorBoard: the resumed process writes a new event file that starts right after the checkpoint.
    (new,) = set(glob.glob(os.path.join(resumed, "tb", "chain", "*"))) - before
    assert sorted(set(event_steps(new))) == list(range(every + 1, n + 1))


def test_kill_during_a_save_resumes_from_the_previous_complete_step(tmp_path):
    run_dir = str(tmp_path / "run")
    args = [*TINY, "trainer.steps=6", "checkpoint.every=2", f"hydra.run.dir={run_dir}"]
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", CHAIN_TEST_SAVE_PAUSE="120@4")  # stall the save of step 4
    p = subprocess.Popen(
        [sys.executable, "-m", "chain", *args],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        for line in p.stderr:
            if "test-hook: saved stage_00 of step 4" in line:
                break
        else:
            pytest.fail("the save of step 4 never started")
        p.kill()  # stage_00 has written step 4; stage_01, data/ and the manifest have not
    finally:
        p.kill()
        p.wait()
    assert manifest(run_dir)["step"] == 2
    assert os.path.exists(os.path.join(run_dir, "stage_00", "ckpt-4.index"))
    assert not os.path.exists(os.path.join(run_dir, "stage_01", "ckpt-4.index"))
    os.makedirs(os.path.join(run_dir, "stage_01", "ckpt-4_temp"))  # what a kill inside a write leaves
    r = cli(tmp_path, *args, "resume=true")
    assert r.returncode == 0, r.stderr
    assert read_summary(run_dir)["resumed_from"] == 2  # lost only the steps since the last complete save
    m = manifest(run_dir)
    assert m["step"] == 6 and m["complete"] == [2, 4, 6]
    assert not os.path.exists(os.path.join(run_dir, "stage_01", "ckpt-4_temp"))


def test_resume_without_a_checkpoint_is_one_clear_line(tmp_path):
    run_dir = str(tmp_path / "nothing")
    r = cli(tmp_path, *TINY, "trainer.steps=2", f"hydra.run.dir={run_dir}", "resume=true")
    assert r.returncode == 2
    assert r.stderr.strip() == (
        f"error: resume=true, but {run_dir} has no complete checkpoint (checkpoint.json is missing); "
        "point hydra.run.dir at a run that saved one, or drop resume=true to start a new run"
    )


# Stage 1 alone gets a learning rate that overflows its weights within a few steps.
EXPLODING = [
    "+stages=[{},{optim: {lr: 1e30}}]",
    "model.width=16",
    "data.batch_size=32",
    "trainer.progress=false",
    "trainer.steps=6",
    "checkpoint.every=1",
]


@pytest.fixture(scope="module")
def stopped(tmp_path_factory):
    """A run that stopped on a non-finite update: (run_dir, result, failing step)."""
    cwd = tmp_path_factory.mktemp("nan")
    run_dir = str(cwd / "run")
    r = cli(cwd, *EXPLODING, f"hydra.run.dir={run_dir}")
    m = re.fullmatch(
        r"error: stage 1: loss or gradients are not finite at step (\d+); that update was not applied "
        r"\(trainer.on_nan=stop\); the last complete checkpoint \(step (\d+)\) is intact",
        r.stderr.strip(),
    )
    assert m, r.stderr
    return run_dir, r, int(m.group(1)), int(m.group(2))


def test_nan_stops_naming_the_stage_and_step_and_keeps_the_last_good_checkpoint(stopped):
    run_dir, r, step, saved = stopped
    assert r.returncode == 3
    assert 1 < step <= 6 and saved == step - 1 and manifest(run_dir)["step"] == saved
    assert not glob.glob(os.path.join(run_dir, "*", f"ckpt-{step}*"))  # the bad state was not saved
    assert not os.path.exists(os.path.join(run_dir, "summary.json"))
    for k in range(2):
        for key, value in stage_values(run_dir, f"stage_{k:02d}").items():
            if np.issubdtype(value.dtype, np.floating):
                assert np.isfinite(value).all(), (k, key)


def test_a_mismatched_resume_is_refused_and_leaves_the_run_intact(stopped, tmp_path):
    run_dir = stopped[0]
    r = cli(tmp_path, *EXPLODING, "+stages=3", f"hydra.run.dir={run_dir}", "resume=true")
    assert r.returncode == 2
    assert r.stderr.strip().startswith("error: the checkpoint has 2 stages but the config builds 3")
    assert manifest(run_dir)["step"] == stopped[3]


def test_on_nan_skip_continues_and_counts_the_skipped_updates(stopped, tmp_path):
    run_dir = str(tmp_path / "copy")
    shutil.copytree(stopped[0], run_dir)
    r = cli(tmp_path, *EXPLODING, f"hydra.run.dir={run_dir}", "resume=true", "trainer.on_nan=skip")
    assert r.returncode == 0, r.stderr
    s = read_summary(run_dir)
    skipped = [st["skipped_steps"] for st in s["stages"]]
    assert skipped[0] == 0 and skipped[1] >= 1 and s["skipped_steps"] == sum(skipped)
    # A skipped update leaves the optimizer untouched: its iteration count misses exactly those steps.
    iterations = [
        int(stage_values(run_dir, f"stage_{k:02d}")["optimizer/_iterations/.ATTRIBUTES/VARIABLE_VALUE"])
        for k in range(2)
    ]
    assert iterations == [6, 6 - skipped[1]]
    for key, value in stage_values(run_dir, "stage_01").items():
        if np.issubdtype(value.dtype, np.floating):
            assert np.isfinite(value).all(), key
