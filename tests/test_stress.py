"""The crash-safety scripts, run briefly: random SIGKILLs with resumes end bit-exact, two
runs racing for one directory never both run, and a run that loses a cluster worker goes on. (The full runs: scripts/, figures in docs/benchmarks.md.)"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from conftest import EXTENDED

SCRIPTS = Path(__file__).resolve().parents[1] / "scripts"


@EXTENDED  # test_resume kills runs and resumes them bit-exact; this is the stress script's smoke run
def test_random_kills_during_saves_and_steps_resume_bit_exact(tmp_path):
    r = subprocess.run(
        [
            sys.executable,
            str(SCRIPTS / "stress_kill.py"),
            "--kills",
            "1",
            "--modes",
            "e2e",
            "--steps",
            "5",
            "--pause",
            "0.2",
            "--workdir",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=1200,
    )
    assert r.returncode == 0, r.stdout + r.stderr[-2000:]
    lines = r.stdout.splitlines()
    for mode in ("e2e",):  # mode=local saves through the same code (test_resume kills both)
        (line,) = [line for line in lines if line.startswith(f"{mode}: ")]
        assert line.startswith(f"{mode}: 1 kills") and "torn checkpoints used: 0" in line
        assert "leftovers after resume: 0" in line and line.endswith("final weights bit-exact: True")
    assert lines[-1] == "OK"


@EXTENDED  # test_run_dir holds the lock's rules; this is the stress script's smoke run
def test_two_runs_racing_for_one_directory(tmp_path):
    r = subprocess.run(
        [sys.executable, str(SCRIPTS / "stress_race.py"), "--races", "2"], capture_output=True, text=True, timeout=1200
    )
    assert r.returncode == 0, r.stdout + r.stderr[-2000:]
    assert r.stdout.splitlines()[-1] == "2 of 2 races kept the rules"


@EXTENDED  # test_cluster loses a worker with replan and with wait; this is the stress script's smoke run
def test_a_run_that_loses_a_worker_goes_on_to_its_end(tmp_path):
    args = ["--steps", "12", "--every", "4", "--lost-after", "5", "--workdir", str(tmp_path)]
    r = subprocess.run(
        [sys.executable, str(SCRIPTS / "stress_lost.py"), *args], capture_output=True, text=True, timeout=1200
    )
    assert r.returncode == 0, r.stdout + r.stderr[-2000:]
    lines = [line for line in r.stdout.splitlines() if not line.startswith("  ")]
    assert lines[-3].startswith("replan: exit 0, ended at step 12") and lines[-3].endswith("(ok)")
    assert lines[-2].startswith("wait: exit 0, ended at step 12") and "bit for bit" in lines[-2]
    assert lines[-1] == "OK"
