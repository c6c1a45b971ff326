"""The run directory from the command line: one run at a time, a refused run changes nothing,
a dead run's lock is not obeyed, and bad directories are one line. Each case a fresh process."""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import sys

import pytest

from conftest import manifest, paused_in_save, run_cli

TINY = ["+stages=2", "model.width=8", "data.batch_size=16", "trainer.progress=false", "checkpoint.export=false"]


def snapshot(run_dir) -> dict[str, tuple[str, float]]:
    """Every file under `run_dir` with its content hash and modification time."""
    out = {}
    for root, _, files in os.walk(run_dir):
        for f in files:
            path = os.path.join(root, f)
            out[os.path.relpath(path, run_dir)] = (
                hashlib.sha256(open(path, "rb").read()).hexdigest(),
                os.stat(path).st_mtime_ns,
            )
    return out


def one_line(r: subprocess.CompletedProcess) -> str:
    lines = [line for line in r.stderr.splitlines() if line.strip()]
    assert r.returncode == 2 and len(lines) == 1 and lines[0].startswith("error: "), r.stderr
    assert "Traceback" not in r.stderr + r.stdout
    return lines[0]


def test_a_second_run_on_a_live_directory_is_refused_and_changes_nothing(tmp_path):
    run_dir = str(tmp_path / "live")
    # it pauses 120 s in its save of step 2, holding the directory
    with paused_in_save(tmp_path, run_dir, *TINY, "trainer.steps=4", "checkpoint.every=2", step=2) as live:
        before = snapshot(run_dir)
        for extra in ([], ["resume=true"]):  # a new run, and a resume, of the same directory
            r = run_cli(tmp_path, *TINY, "trainer.steps=4", f"hydra.run.dir={run_dir}", *extra)
            line = one_line(r)
            assert re.search(rf"is in use by another run \(pid {live.pid} on .*, since .*\); wait for it to end", line)
        assert snapshot(run_dir) == before  # .hydra/, the log, the checkpoints: untouched


HOLDER = """
import sys, time
from chain.state import lock
lock.acquire(sys.argv[1], name_holder=False)  # as the CLI: look first, name yourself after
print("held", flush=True)
time.sleep(float(sys.argv[2]))
if sys.argv[3] == "announce":
    lock.announce(sys.argv[1])
    time.sleep(30)
"""


@pytest.mark.parametrize("holder", ["announce", "let go"])
def test_a_refused_run_waits_for_the_holder_to_name_itself_or_to_let_go(tmp_path, holder):
    from chain.state import lock

    run_dir = str(tmp_path / "run")
    p = subprocess.Popen([sys.executable, "-c", HOLDER, run_dir, "0.5", holder], stdout=subprocess.PIPE, text=True)
    try:
        assert p.stdout.readline().strip() == "held"
        if holder == "announce":
            with pytest.raises(lock.RunDirLocked, match=rf"in use by another run \(pid {p.pid} on "):
                lock.acquire(run_dir)
        else:  # the holder was refused after looking and let go: the lock is free to take
            assert lock.acquire(run_dir) is None and lock.held(run_dir)
            lock.release(run_dir)
    finally:
        p.kill()
        p.wait()


def test_a_dead_runs_lock_is_taken_over_with_a_note(tmp_path):
    run_dir = str(tmp_path / "dead")
    args = [*TINY, "trainer.steps=4", "checkpoint.every=2", f"hydra.run.dir={run_dir}"]
    r = run_cli(tmp_path, *args, env={"CHAIN_TEST_KILL_AT_STEP": "3"})
    assert r.returncode == -9
    holder = open(os.path.join(run_dir, ".lock")).read().strip()
    assert holder.startswith("pid ")  # the killed run's PID is still written there, its lock gone
    r = run_cli(tmp_path, *args, "resume=true")
    assert r.returncode == 0, r.stderr
    assert f"note: took over the lock of a run that is no longer running ({holder})" in r.stdout
    assert open(os.path.join(run_dir, ".lock")).read() == ""  # a clean exit leaves no holder


def test_a_new_run_refused_by_a_checkpoint_leaves_the_old_runs_files_alone(tmp_path):
    run_dir = str(tmp_path / "old")
    assert run_cli(tmp_path, *TINY, "trainer.steps=2", f"hydra.run.dir={run_dir}").returncode == 0
    before = snapshot(run_dir)
    r = run_cli(tmp_path, *TINY, "trainer.steps=3", "model.width=4", f"hydra.run.dir={run_dir}")
    assert one_line(r) == (
        f"error: {run_dir} already holds a checkpoint at step 2; pass resume=true to continue "
        "it, or choose another hydra.run.dir"
    )
    assert snapshot(run_dir) == before  # .hydra/overrides.yaml included: restage still reads the old run


def test_a_resume_keeps_the_hydra_files_of_the_run_it_continues(tmp_path):
    run_dir = str(tmp_path / "kept")
    assert run_cli(tmp_path, *TINY, "trainer.steps=2", f"hydra.run.dir={run_dir}").returncode == 0
    overrides = open(os.path.join(run_dir, ".hydra", "overrides.yaml")).read()
    assert run_cli(tmp_path, *TINY, "trainer.steps=3", f"hydra.run.dir={run_dir}", "resume=true").returncode == 0
    assert open(os.path.join(run_dir, ".hydra", "overrides.yaml")).read() == overrides
    assert manifest(run_dir)["step"] == 3


def test_a_run_directory_under_a_file_is_one_line(tmp_path):
    (tmp_path / "plain").write_text("not a directory")
    r = run_cli(tmp_path, *TINY, "trainer.steps=2", f"hydra.run.dir={tmp_path / 'plain' / 'run'}")
    assert "cannot use run directory" in one_line(r) and "Not a directory" in r.stderr
    assert sorted(os.listdir(tmp_path)) == ["plain"]


def test_a_model_too_large_for_memory_is_refused_with_the_estimate(tmp_path):
    r = run_cli(tmp_path, *TINY, "model.width=1000000", "trainer.steps=2")
    line = one_line(r)
    assert re.search(
        r"the chain needs about [\d.]+ TB of memory \(stage 1: [\d.]+ TB; .*\), more than the [\d.]+ GB "
        r"allowed",
        line,
    ), line
    assert os.listdir(tmp_path) == []


@pytest.fixture(scope="module")
def finished_4_stages(tmp_path_factory):
    """A finished 4-stage run to restage (each case works on its own copy)."""
    where = tmp_path_factory.mktemp("restage_src")
    src = str(where / "src")
    assert run_cli(where, *TINY, "+stages=4", "trainer.steps=2", f"hydra.run.dir={src}").returncode == 0
    return src


@pytest.mark.parametrize("case", ["stages=0", "dst is a file", "corrupt source manifest"])
def test_restage_bad_input_is_one_line(tmp_path, finished_4_stages, case):
    src = str(tmp_path / "src")
    shutil.copytree(finished_4_stages, src)
    dst, extra = str(tmp_path / "dst"), ["+stages=2"]
    if case == "stages=0":
        extra, message = ["+stages=0"], "stages=0 must be a positive integer"
    elif case == "dst is a file":
        open(dst, "w").close()
        message = f"{dst} is a file; DST must be a run directory"
    else:
        with open(os.path.join(src, "checkpoint.json"), "w") as f:
            f.write("{garbage")
        message = "checkpoint.json is not valid JSON"
    r = run_cli(tmp_path, src, dst, *extra, module="chain.restage")
    assert message in one_line(r)
