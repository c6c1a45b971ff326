"""One job of a `--multirun` sweep as the sweep's command reads it back (`chain.sweep`): the job
writes it in its own process, the command gathers every job's into the table it prints and the
sweep directory's `jobs.csv`."""

from __future__ import annotations

from dataclasses import dataclass

from chain.records.serial import item


@dataclass(frozen=True)
class JobOutcome:
    """How one job of a sweep ended."""

    job: int | None = item("the job's number in the sweep, from 0", default=None)
    overrides: list[str] | None = item("the job's overrides (Hydra's task overrides)", default=None)
    code: int | None = item("its exit code: 0, or the code of the error that stopped it", default=None)
    message: str | None = item("the error's line (null: it finished)", default=None)
    run_dir: str | None = item("its run directory (null: none was left, the job failed before training)", default=None)
    sweep_dir: str | None = item("the sweep's directory (hydra.sweep.dir)", default=None)
    steps: int | None = item("optimizer steps taken", default=None)
    loss: float | None = item(
        "the loss of the last step (mode=local: the stages' sum, as the log shows it)", default=None
    )
    val: list[dict[str, float]] | None = item(
        "the last validation metrics, one mapping per read-out: the chain's "
        "(mode=e2e) or each stage's or variant's (null: no validation set)",
        default=None,
    )
