"""`python -m chain --multirun ...`: a Hydra sweep whose bad jobs are one line each.

Before Hydra starts a job, `check` composes and validates every job of the sweep: bad ones are
refused together, one line each, exit 2, nothing written. A job that fails while it runs (a
device, a data file, a full disk) records its line in a directory the sweep's command made
(`OUTCOMES`, passed to the jobs' processes in the environment) and ends normally: a job that
exits non-zero makes Hydra's launcher raise and Hydra print a traceback. A job that finishes
records its figures there too (`chain.records.sweeps.JobOutcome`). After the sweep, `run` prints a
table of the jobs (overrides, exit code, steps, last loss, last validation metrics, run directory),
writes it as `jobs.csv` in the sweep directory, prints the failed jobs' lines and exits with the
first failed job's code.
"""

from __future__ import annotations

import csv
import json
import os
import sys
import tempfile
from typing import TYPE_CHECKING, Callable, Sequence

from chain.errors import ChainError
from chain.records.serial import from_json, to_json
from chain.records.sweeps import JobOutcome

if TYPE_CHECKING:
    from chain.records.summaries import Summary

OUTCOMES = "CHAIN_SWEEP_OUTCOMES"


def _number(o: JobOutcome) -> int:
    """A job's place in the sweep's order (-1: unnumbered)."""
    return o.job if o.job is not None else -1


def _refuse(failed: Sequence[JobOutcome]) -> None:
    """One line per failed job (job number, its overrides, the error), then exit with the first one's code."""
    if failed:
        failed = sorted(failed, key=_number)
        for o in failed:
            print(f"error: job {o.job} ({' '.join(o.overrides or ())}): {o.message}", file=sys.stderr)
        sys.exit(failed[0].code)


def check_jobs(overrides: Sequence[str]) -> None:
    """Compose and validate every job `overrides` sweep over; exit with one line per bad job."""
    from chain.config.hydra import check_job_name, compose_config, sweep_jobs
    from chain.prepared import check_config

    bad = []
    for num, job in enumerate(sweep_jobs(overrides)):
        try:
            cfg = compose_config(job, with_hydra=True)
            check_job_name(cfg)
            check_config(cfg)
        except ChainError as e:
            bad.append(JobOutcome(job=num, overrides=list(job), code=e.exit_code, message=str(e)))
    _refuse(bad)


def in_job() -> bool:
    """True inside a job of a sweep that `run` started (its failures are recorded, not exits)."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    return HydraConfig.get().mode == RunMode.MULTIRUN and bool(os.environ.get(OUTCOMES))


def _write(outcome: JobOutcome) -> None:
    with open(os.path.join(os.environ[OUTCOMES], f"{outcome.job}.json"), "w") as f:
        json.dump(to_json(outcome), f)


def _job() -> dict:
    """This job's number, overrides and directories, from Hydra."""
    from hydra.core.hydra_config import HydraConfig

    hydra = HydraConfig.get()
    run_dir = hydra.runtime.output_dir
    return {
        "job": hydra.job.num,
        "overrides": list(hydra.overrides.task),
        "sweep_dir": os.path.abspath(hydra.sweep.dir),
        "run_dir": os.path.abspath(run_dir) if os.path.isdir(run_dir) else None,
    }


def record(message: str, code: int) -> None:
    """This job failed: print its line (to the job's own log) and leave it for the sweep's command."""
    print(f"error: {message}", file=sys.stderr, flush=True)
    _write(JobOutcome(code=code, message=message, **_job()))


def record_done(summary: Summary) -> None:
    """This job finished: leave its figures (steps, last loss, last validation metrics) for the sweep's table."""
    val = [summary.val] if summary.val else [s.val for s in summary.stages or () if s.val]
    _write(JobOutcome(code=0, message=None, steps=summary.steps, loss=summary.loss_last, val=val or None, **_job()))


def _outcomes(folder: str) -> list[JobOutcome]:
    out = []
    for name in os.listdir(folder):
        with open(os.path.join(folder, name)) as f:
            out.append(from_json(JobOutcome, json.load(f)))
    return sorted(out, key=_number)


def _short(v: float | None) -> str:
    return "-" if v is None else f"{v:.4g}"


def _exact(v: float | None) -> str:
    return "" if v is None else repr(v)


def rows(outcomes: Sequence[JobOutcome], number: Callable[[float | None], str] = _short) -> list[list[str]]:
    """The jobs' table, header first: job, exit, steps, loss, one column per validation metric (the
    read-outs' values joined by ' / ': the chain's, or each stage's), overrides, run directory."""
    metrics = list(dict.fromkeys(k for o in outcomes for v in o.val or () for k in v))
    header = ["job", "exit", "steps", "loss", *(f"val_{m}" for m in metrics), "overrides", "run_dir"]
    table = [header]
    for o in outcomes:
        vals = [" / ".join(number(v.get(m)) for v in o.val) if o.val else number(None) for m in metrics]
        table.append(
            [
                str(o.job),
                str(o.code),
                number(None) if o.steps is None else str(o.steps),
                number(o.loss),
                *vals,
                " ".join(o.overrides or ()),
                o.run_dir or number(None),
            ]
        )
    return table


def _shown(path: str) -> str:
    """`path` relative to the working directory when it is below it."""
    rel = os.path.relpath(path)
    return path if rel.startswith("..") else rel


def table(outcomes: Sequence[JobOutcome]) -> str:
    """The jobs' table as the console shows it: columns aligned, of each job's overrides those that
    are not the same in every job (jobs.csv has them all), run directories relative to here."""
    body = rows(outcomes)
    common = set.intersection(*(set(o.overrides or ()) for o in outcomes)) if len(outcomes) > 1 else set()
    body[1:] = [
        [
            *r[:-2],
            " ".join(x for x in o.overrides or () if x not in common) or _short(None),
            r[-1] if r[-1] == _short(None) else _shown(r[-1]),
        ]
        for r, o in zip(body[1:], outcomes)
    ]
    widths = [max(len(r[i]) for r in body) for i in range(len(body[0]))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in body)


def write_csv(outcomes: Sequence[JobOutcome], path: str) -> None:
    """The jobs' table as CSV (absolute run directories, and each failed job's error line)."""
    body = rows(outcomes, _exact)
    with open(path, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow([*body[0], "error"])
        writer.writerows([*r, o.message or ""] for r, o in zip(body[1:], outcomes))


def run(sweep: Callable[[], None]) -> None:
    """Run `sweep` (Hydra's multirun), then print the jobs' table (and write it to the sweep
    directory's jobs.csv), and exit with one line per job that failed."""
    with tempfile.TemporaryDirectory(prefix="chain-sweep-") as folder:
        os.environ[OUTCOMES] = folder
        try:
            sweep()
        finally:  # what the jobs that ended recorded, even when Hydra stopped on one that crashed
            outcomes = _outcomes(folder)
            _report(outcomes)
    _refuse([o for o in outcomes if o.code])


def _report(outcomes: Sequence[JobOutcome]) -> None:
    if not outcomes:
        return
    print(table(outcomes), flush=True)
    if any(len(o.val or ()) > 1 for o in outcomes):
        print("note: val_*: one value per stage (mode=local) or variant, in order", flush=True)
    sweep_dir = next((o.sweep_dir for o in outcomes if o.sweep_dir), None)
    if sweep_dir and os.path.isdir(sweep_dir):
        path = os.path.join(sweep_dir, "jobs.csv")
        try:
            write_csv(outcomes, path)
        except OSError as e:
            print(f"note: {path} could not be written: {e.strerror or e}", flush=True)
            return
        print(f"jobs: {_shown(path)}; each job's output: {_shown(os.path.join(sweep_dir, '.submitit'))}/", flush=True)
