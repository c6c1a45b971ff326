"""`python -m chain --multirun ...`: a Hydra sweep whose bad jobs are one line each.

Before Hydra starts a job, `check` composes and validates every job of the sweep: bad ones are
refused together, one line each, exit 2, nothing written. A job that fails while it runs (a
device, a data file, a full disk) records its line in a directory the sweep's command made
(`OUTCOMES`, passed to the jobs' processes in the environment) and ends normally: a job that
exits non-zero makes Hydra's launcher raise and Hydra print a traceback. After the sweep, `run`
prints the recorded lines and exits with the first failed job's code.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from typing import Callable, Sequence

from chain.errors import ChainError

OUTCOMES = "CHAIN_SWEEP_OUTCOMES"


def _refuse(jobs: list[tuple[int, list[str], str, int]]) -> None:
    """One line per failed job (job number, its overrides, the error), then exit with the first one's code."""
    if jobs:
        jobs = sorted(jobs)
        for num, overrides, message, _ in jobs:
            print(f"error: job {num} ({' '.join(overrides)}): {message}", file=sys.stderr)
        sys.exit(jobs[0][3])


def check(overrides: Sequence[str]) -> None:
    """Compose and validate every job `overrides` sweep over; exit with one line per bad job."""
    from chain.config.hydra import check_job_name, compose_config, sweep_jobs
    from chain.spec import check as check_config

    bad = []
    for num, job in enumerate(sweep_jobs(overrides)):
        try:
            cfg = compose_config(job, with_hydra=True)
            check_job_name(cfg)
            check_config(cfg)
        except ChainError as e:
            bad.append((num, job, str(e), e.exit_code))
    _refuse(bad)


def in_job() -> bool:
    """True inside a job of a sweep that `run` started (its failures are recorded, not exits)."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    return HydraConfig.get().mode == RunMode.MULTIRUN and bool(os.environ.get(OUTCOMES))


def record(message: str, code: int) -> None:
    """This job failed: print its line (to the job's own log) and leave it for the sweep's command."""
    from hydra.core.hydra_config import HydraConfig

    print(f"error: {message}", file=sys.stderr, flush=True)
    hydra = HydraConfig.get()
    with open(os.path.join(os.environ[OUTCOMES], f"{hydra.job.num}.json"), "w") as f:
        json.dump({"job": hydra.job.num, "overrides": list(hydra.overrides.task), "message": message, "code": code}, f)


def run(sweep: Callable[[], None]) -> None:
    """Run `sweep` (Hydra's multirun), then exit with one line per job that failed."""
    failed = []
    with tempfile.TemporaryDirectory(prefix="chain-sweep-") as outcomes:
        os.environ[OUTCOMES] = outcomes
        sweep()
        for name in os.listdir(outcomes):
            with open(os.path.join(outcomes, name)) as f:
                r = json.load(f)
            failed.append((r["job"], r["overrides"], r["message"], r["code"]))
    _refuse(failed)
