"""The command lines on what a careless or hostile user gives them: damaged files under a run
directory (the report), sweeps with a bad job, paths that would escape or break the run
directory, Ctrl-C, a log on a full device, a live run's directory read by restage, storage
errors that must say why, and a lock file holding garbage. Each: one line, the right exit code,
nothing half-written. CLI cases are fresh processes."""

from __future__ import annotations

import csv
import errno
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys

import pytest

import chain
from chain.errors import ChainError, StorageError
from conftest import EXTENDED, manifest, paused_in_save, run_cli

TINY = ["model.width=8", "data.batch_size=16", "trainer.progress=false", "checkpoint.export=false"]


def one_line(r: subprocess.CompletedProcess, code: int = 2) -> str:
    """The single `error: ...` line of a refused command (and nothing else on stderr)."""
    lines = [line for line in r.stderr.splitlines() if line.strip()]
    assert r.returncode == code and len(lines) == 1 and lines[0].startswith("error: "), (r.returncode, r.stderr)
    assert "Traceback" not in r.stderr + r.stdout
    return lines[0]


# --- python -m chain.report on damaged files -------------------------------------------------------


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    """A finished 2-stage run with the overrides file Hydra would have written."""
    run_dir = str(tmp_path_factory.mktemp("finished") / "run")
    chain.build(chain.compose([*TINY, "trainer.steps=2"]), run_dir=run_dir).fit()
    os.makedirs(os.path.join(run_dir, ".hydra"))
    with open(os.path.join(run_dir, ".hydra", "overrides.yaml"), "w") as f:
        f.write("- trainer.steps=2\n")
    return run_dir


def damaged_copy(finished, tmp_path, name: str, content: bytes) -> tuple[str, str]:
    run_dir = str(tmp_path / "run")
    shutil.copytree(finished, run_dir)
    path = os.path.join(run_dir, name)
    with open(path, "wb") as f:
        f.write(content)
    return run_dir, path


DAMAGE = {
    "summary.json": [
        b"\x00\xff\xfe garbage",
        b"[1, 2]",
        b"NaN",
        b'{"stages": 5}',
        b'{"stages": [{"index": "x"}]}',
        b'{"stages": [{"index": 0, "device": 3}]}',
        b'{"steps": "many"}',
        b'{"mode": "local", "stag',
        b'{"schedule": "bogus", "microbatches": 2, "batch_size": 16}',
        b'{"replica_devices": [1, 2]}',
        b'{"schedule": "gpipe", "microbatches": 1000000000, "batch_size": 16}',
    ],
    ".hydra/overrides.yaml": [b"\x00\xff\xfe garbage", b"{a: 1}", b"[1, [2, 3]", b"- [x]\n", b"- 5\n", b"just text"],
}


@pytest.mark.parametrize("name, content", [(n, c) for n, cs in DAMAGE.items() for c in cs])
def test_a_damaged_summary_or_overrides_file_is_an_error_naming_it(finished, tmp_path, name, content):
    from chain.report import runs

    run_dir, path = damaged_copy(finished, tmp_path, name, content)
    with pytest.raises(ChainError) as e:
        runs.load(run_dir)
    assert path in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize(
    "timeline",
    [
        b"[1]",
        b'{"steps": 3}',
        b'{"steps": [{"complete": true, "step": 2}]}',
        b'{"steps": [{"complete": true, "step": 2, "actions": [{"stage": 9}]}]}',
    ],
)
def test_a_damaged_timeline_is_an_error_naming_it(finished, tmp_path, timeline):
    from chain.report import write_report

    run_dir, path = damaged_copy(finished, tmp_path, "timeline.json", timeline)
    with open(os.path.join(run_dir, "summary.json")) as f:
        summary = json.load(f)
    with open(os.path.join(run_dir, "summary.json"), "w") as f:  # a pipeline run's: its timeline is drawn
        json.dump({**summary, "mode": "e2e", "schedule": "gpipe", "microbatches": 2}, f)
    with pytest.raises(ChainError) as e:
        write_report(run_dir)
    assert path in str(e.value) and "\n" not in str(e.value)
    assert not os.path.exists(os.path.join(run_dir, "report.html"))


@pytest.mark.parametrize(
    "name, content",
    [
        # the suite's time: the command's one line runs every time (overrides.yaml), a damaged summary.json's
        # error in the report above
        pytest.param("summary.json", b'{"stages": [{"index": "x"}]}', marks=EXTENDED),
        (".hydra/overrides.yaml", b"\x00\xff\xfe garbage"),
    ],
)
def test_the_report_command_on_a_damaged_file_is_one_line_naming_it(finished, tmp_path, name, content):
    run_dir, path = damaged_copy(finished, tmp_path, name, content)
    assert path in one_line(run_cli(tmp_path, run_dir, module="chain.report"))
    assert not os.path.exists(os.path.join(run_dir, "report.html"))


# --- --multirun ----------------------------------------------------------------------------------


def test_a_sweep_with_bad_jobs_is_one_line_per_job_and_writes_nothing(tmp_path):
    r = run_cli(tmp_path, "--multirun", *TINY, "trainer.steps=2", "optim.lr=0.01,-1,-2", "hydra.sweep.dir=sweep")
    lines = [line for line in r.stderr.splitlines() if line.strip()]
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert len(lines) == 2, r.stderr
    for line, (job, lr) in zip(lines, [(1, "-1"), (2, "-2")]):
        assert line.startswith(f"error: job {job} (") and line.endswith(f"optim.lr={lr} must be > 0"), line
    assert not os.path.exists(tmp_path / "sweep")


def test_a_sweep_job_failing_while_it_runs_is_one_line(tmp_path):
    r = run_cli(
        tmp_path, "--multirun", *TINY, "trainer.steps=2", "placement.devices=[/CPU:0,/CPU:7]", "hydra.sweep.dir=sweep"
    )
    line = one_line(r)
    assert line.startswith("error: job 0 (") and "placement.devices[1]='/CPU:7' does not exist" in line
    assert not os.path.exists(tmp_path / "sweep" / "0")  # the job failed before training: nothing of it left
    # The jobs' table (stdout) and jobs.csv show it with its exit code, and the error in the file.
    assert re.search(r"^0\s+2\s+-\s+-\s+model.width=8 .*\s-$", r.stdout, re.M), r.stdout
    with open(tmp_path / "sweep" / "jobs.csv") as f:
        (job,) = list(csv.DictReader(f))
    assert (job["exit"], job["run_dir"], job["error"]) == ("2", "", line[len("error: job 0 (") :].split("): ", 1)[1])


@pytest.mark.parametrize(
    "args, says",
    [
        (["trainer.steps=2", "--multirun", "optim.lr=0.1,0.01"], "put the flags first"),
        (["trainer.steps=2", "optim.lr=0.1,0.01"], "needs --multirun"),
    ],
)
def test_hydra_flag_order_and_a_sweep_without_multirun_are_explained_in_one_line(tmp_path, args, says):
    line = one_line(run_cli(tmp_path, *args))
    assert says in line and "optim.lr=0.1,0.01" in line
    assert not os.path.exists(tmp_path / "outputs") and not os.path.exists(tmp_path / "multirun")


# --- paths -----------------------------------------------------------------------------------------


def test_a_job_name_with_a_path_is_refused_before_anything_is_written(tmp_path):
    run_dir = tmp_path / "a" / "b" / "run"
    line = one_line(run_cli(tmp_path, *TINY, "trainer.steps=2", "hydra.job.name=../../x", f"hydra.run.dir={run_dir}"))
    assert "hydra.job.name='../../x'" in line
    assert not os.path.exists(tmp_path / "a")  # neither the run directory nor the log outside it


def test_a_quoted_run_dir_with_commas_parentheses_equals_and_quotes_works(tmp_path):
    name = "o,p(q)=r's"
    hydra_quoted = "'" + name.replace("'", "\\'") + "'"  # as a user quotes it for Hydra
    r = run_cli(tmp_path, *TINY, "trainer.steps=2", f"hydra.run.dir={hydra_quoted}")
    assert r.returncode == 0, r.stderr
    run_dir = tmp_path / name
    assert manifest(run_dir)["step"] == 2 and os.path.exists(run_dir / "summary.json")
    assert open(run_dir / ".lock").read() == ""  # released


@pytest.mark.parametrize("where", ["in a save", pytest.param("in training", marks=EXTENDED)])  # EXTENDED: suite time
def test_ctrl_c_is_one_line_with_the_newest_checkpoint_and_the_resume_command(tmp_path, where):
    run_dir = tmp_path / "run"
    if where == "in a save":  # the save of step 10 pauses after each part: Ctrl-C lands in the middle of it
        env, cue = {"CHAIN_TEST_SAVE_PAUSE": "2@10"}, "test-hook: saved stage_00 of step 10"
    else:  # as soon as a step is done, wherever the run is then
        env, cue = {"CHAIN_TEST_ANNOUNCE": "1"}, "test-hook: step 12 done"
    args = [*TINY, "trainer.steps=100000", "checkpoint.every=5", f"hydra.run.dir={run_dir}"]
    # As from a terminal: Ctrl-C reaches a process that has not inherited an ignored SIGINT (a test run
    # started in the background by a non-interactive shell ignores it, and Python then leaves it ignored).
    p = subprocess.Popen(
        [sys.executable, "-m", "chain", *args],
        cwd=tmp_path,
        env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", **env),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    try:
        for line in p.stderr:
            if cue in line:
                p.send_signal(signal.SIGINT)
                break
        else:
            pytest.fail(f"the run never printed {cue!r}")
        out, err = p.communicate(timeout=120)
    finally:
        p.kill()
    lines = [line for line in err.splitlines() if line.strip() and not line.startswith("test-hook:")]
    assert p.returncode == 130 and len(lines) == 1, err
    m = re.fullmatch(
        r"interrupted at step (\d+); the newest complete checkpoint is step (\d+) \((.+)\); "
        r"resume with: (.+)",
        lines[0],
    )
    assert m, lines[0]
    step, saved = int(m.group(1)), int(m.group(2))
    assert m.group(3) == str(run_dir) and saved == manifest(run_dir)["step"] and saved % 5 == 0
    if where == "in a save":
        assert step == saved == 10  # the save finished first
    else:
        assert 12 <= step and 10 <= saved <= step
    for part in ("stage_00", "stage_01", "data"):  # nothing of a step the manifest does not name
        steps = {int(re.match(r"ckpt-(\d+)", n).group(1)) for n in os.listdir(run_dir / part) if n.startswith("ckpt-")}
        assert steps == set(manifest(run_dir)["complete"]), (part, os.listdir(run_dir / part))
    assert open(run_dir / ".lock").read() == ""  # released, no holder left
    command = shlex.split(m.group(4))
    assert command[:3] == ["python", "-m", "chain"] and command[-1] == "resume=true"
    resumed = run_cli(
        tmp_path, *[a for a in command[3:] if not a.startswith("trainer.steps=")], f"trainer.steps={saved + 2}"
    )
    assert resumed.returncode == 0, resumed.stderr
    assert f"resumed from step {saved}" in resumed.stdout and manifest(run_dir)["step"] == saved + 2


def test_a_log_on_a_full_device_stops_the_run_in_one_line(tmp_path):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    os.symlink("/dev/full", run_dir / "chain.log")  # every write fails: No space left on device
    line = one_line(run_cli(tmp_path, *TINY, "trainer.steps=20", f"hydra.run.dir={run_dir}"), code=4)
    assert f"cannot write the log {run_dir / 'chain.log'}: No space left on device" in line
    assert open(run_dir / ".lock").read() == ""


HOLDER = """
import sys, time
from chain.state import lock
lock.acquire(sys.argv[1], name_holder=False)
with open(lock.path(sys.argv[1]), "wb") as f:
    f.write(bytes.fromhex(sys.argv[2]))
print("held", flush=True)
time.sleep(60)
"""


def test_a_garbage_lock_file_is_not_echoed(tmp_path):
    run_dir = str(tmp_path / "run")
    garbage = b"pid 1\x1b[2J\x07\x00 \xff\xfe rm -rf /\r\nowned"
    p = subprocess.Popen([sys.executable, "-c", HOLDER, run_dir, garbage.hex()], stdout=subprocess.PIPE, text=True)
    try:
        assert p.stdout.readline().strip() == "held"
        line = one_line(run_cli(tmp_path, *TINY, "trainer.steps=2", f"hydra.run.dir={run_dir}"))
        assert "is in use by another run (unknown)" in line and line.isprintable() and "owned" not in line
    finally:
        p.kill()
        p.wait()


@EXTENDED  # the suite's time: a live run's lock refuses a second run (test_run_dir) and generate (test_quiet)
def test_restage_of_a_run_that_is_still_training_is_refused(tmp_path):
    src, dst = tmp_path / "src", tmp_path / "dst"
    # step 2 complete, step 4 half-written
    with paused_in_save(tmp_path, src, *TINY, "trainer.steps=6", "checkpoint.every=2", step=4) as live:
        line = one_line(run_cli(tmp_path, str(src), str(dst), "+stages=1", module="chain.restage"))
        assert re.search(rf"{src} is in use by a run that is still training \(pid {live.pid} on ", line), line
        assert not os.path.exists(dst)


# --- storage errors say why --------------------------------------------------------------------------


@pytest.mark.parametrize(
    "error, cause",
    [
        (OSError(errno.EFBIG, "write failed"), "File too large"),
        (OSError(errno.ENOSPC, ""), "No space left on device"),
    ],
)
def test_a_storage_error_names_the_cause(tmp_path, error, cause):
    from chain.state.atomic import writing

    with pytest.raises(StorageError, match=f"cannot write the thing: {cause}"):
        with writing("the thing"):
            raise error


EVENTS_PAST_THE_SIZE_LIMIT = """
import resource, sys
from chain.errors import StorageError
from chain.training.logs import Writers
resource.setrlimit(resource.RLIMIT_FSIZE, (20000, resource.RLIM_INFINITY))  # files past 20 kB: EFBIG
w = Writers(sys.argv[1], 1)
try:
    for step in range(100000):
        w.scalars(step, [{"loss": 1.0}], {"loss": 1.0})
        w.flush()
except StorageError as e:
    print(e)
"""


def test_tensorboard_logs_past_the_file_size_limit_are_a_storage_error_with_the_cause(tmp_path):
    r = subprocess.run(
        [sys.executable, "-c", EVENTS_PAST_THE_SIZE_LIMIT, str(tmp_path / "run")],
        capture_output=True,
        text=True,
        timeout=300,
        env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"),
    )
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr[-2000:]
    assert r.stdout.startswith("cannot write TensorBoard logs in") and "File too large" in r.stdout, r.stdout
