"""Two runs racing for one run directory, again and again: exactly one may run.

    python scripts/stress_race.py                  # 20 races
    python scripts/stress_race.py --races 3

Not a test (tests/test_stress.py runs it briefly). Each race starts two identical
`python -m chain` processes at the same moment on the same directory: even races on a new
directory, odd races as two resumes of the previous race's directory. Every time exactly
one must finish (exit 0) and the other must be refused (exit 2, one line: the directory is
in use by the other run's PID, or already holds the checkpoint the winner wrote); no file
that was there before a race may disappear but superseded checkpoints; and afterwards the
directory must verify: a third run resumes it, which checks every file of the newest
checkpoint against its digests. Exit status 1 if any race broke a rule.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile

ARGS = [
    "+stages=2",
    "model.width=16",
    "data.batch_size=32",
    "trainer.progress=false",
    "checkpoint.export=false",
    "checkpoint.every=2",
]


def start(cwd: str, args: list[str]) -> subprocess.Popen:
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", CHAIN_TEST_SAVE_PAUSE="0.2")  # saves slow: long overlap
    return subprocess.Popen(
        [sys.executable, "-m", "chain", *args],
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def snapshot(run_dir: str) -> dict[str, str]:
    """Every file of the directory (but the lock and the log, which the winner owns) by content."""
    out = {}
    for root, _, files in os.walk(run_dir):
        for f in files:
            path = os.path.join(root, f)
            if f not in (".lock",) and not f.endswith(".log"):
                out[os.path.relpath(path, run_dir)] = hashlib.sha256(open(path, "rb").read()).hexdigest()
    return out


def race(workdir: str, run_dir: str, resume: bool, steps: int) -> str | None:
    """One race; None if every rule held, else what broke."""
    args = [*ARGS, f"trainer.steps={steps}", f"hydra.run.dir={run_dir}"] + (["resume=true"] if resume else [])
    before = snapshot(run_dir) if resume else {}
    procs = [start(workdir, args) for _ in range(2)]
    results = [(p.wait(timeout=600), *p.communicate()) for p in procs]
    codes = sorted(code for code, _, _ in results)
    if codes != [0, 2]:
        return f"exit codes {codes}: " + " | ".join(err.strip()[-200:] for _, _, err in results)
    loser = next(err for code, _, err in results if code == 2)
    lines = [line for line in loser.splitlines() if line.strip()]
    if len(lines) != 1 or not ("is in use by another run (pid" in lines[0] or "already holds a checkpoint" in lines[0]):
        return f"the refused run said: {loser.strip()[-300:]}"
    after = snapshot(run_dir)
    if resume and (set(before) - set(after)) - {k for k in before if k.startswith(("stage_", "data/"))}:
        return f"files disappeared: {sorted(set(before) - set(after))}"
    check = subprocess.run(
        [sys.executable, "-m", "chain", *ARGS, f"trainer.steps={steps}", f"hydra.run.dir={run_dir}", "resume=true"],
        cwd=workdir,
        env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"),
        capture_output=True,
        text=True,
    )
    if check.returncode != 0:
        return f"the directory does not verify afterwards: {check.stderr.strip()[-300:]}"
    return None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--races", type=int, default=20)
    ap.add_argument("--steps", type=int, default=4)
    a = ap.parse_args(argv)
    workdir = tempfile.mkdtemp(prefix="stress_race_")
    broken = []
    run_dir, steps = None, a.steps
    for i in range(a.races):
        resume = i % 2 == 1
        if not resume:
            run_dir, steps = os.path.join(workdir, f"race{i:02d}"), a.steps
        else:
            steps += 3  # the resumes have steps left to train
        problem = race(workdir, run_dir, resume, steps)
        print(
            f"race {i + 1:2d} ({'two resumes' if resume else 'two new runs'}): "
            f"{'one ran, one was refused, the directory verifies' if problem is None else 'BROKEN: ' + problem}",
            flush=True,
        )
        if problem:
            broken.append(i + 1)
    shutil.rmtree(workdir, ignore_errors=True)
    print(f"{a.races - len(broken)} of {a.races} races kept the rules" + (f"; broken: {broken}" if broken else ""))
    return 1 if broken else 0


if __name__ == "__main__":
    sys.exit(main())
