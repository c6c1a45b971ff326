"""`python -m chain [overrides]`: the Hydra command line.

Before Hydra writes anything, the command composes and validates the config (no
TensorFlow yet), checks the run directory against `resume` and locks it
(`chain.state.lock`); so a bad config, a directory in use or a refused resume prints one
line and exits 2 with nothing written, not even Hydra's `.hydra/`. `plan_only=true`
prints the plan and exits without a run directory. Then Hydra runs the job (its run
directory, `.hydra/`, `chain.log`); a resumed run keeps the `.hydra/` of the run that
created the directory. With Hydra's own flags (`--cfg`, ...) Hydra runs as it is and each
job validates its config itself; with `--multirun` alone every job of the sweep is validated
first (one line per bad job, nothing written), and a job that fails while it runs is one line
after the sweep (`chain.sweep`).

Errors the user can fix (`ChainError`) print one line and exit 2 (3 when training
stopped on a non-finite loss or gradient, 4 when the file system failed); a new run that
fails before training leaves no run directory behind, and a directory that already held a
run is never removed. Ctrl-C is one line (where training was, the newest complete
checkpoint, the command that resumes) and exit 130.

Under a scheduler (`TF_CONFIG` with a chief, `cluster.launcher=slurm`) the client tells its
workers the exit code when the command ends, and a Slurm task other than 0 serves as a worker
(docs/cluster.md, "Under a scheduler").
"""

from __future__ import annotations

import atexit
import os
import shlex
import shutil
import signal
import sys
from dataclasses import dataclass, replace

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from chain import sweep  # `import chain` first set TensorFlow's C++ log level (chain.cli.quiet_environment)
from chain.cli import fail, import_tensorflow_quietly, quiet_third_party_logs, reader_left
from chain.config import normalize_overrides
from chain.config.schema import Settings
from chain.errors import ChainError, WorkerLost, plural
from chain.prepared import RunSpec, check_config
from chain.training import on_lost


@dataclass
class Preflight:
    """What `main` settled before handing over to Hydra: the checked config (settings and the data
    set's description, `chain.prepared.check_config`), the run directory, and the first directory of its path
    this job created (None: it existed)."""

    spec: RunSpec
    run_dir: str
    created: str | None


_preflight: Preflight | None = None
EXIT_INTERRUPTED = 130  # Ctrl-C, as a shell reports a process ended by SIGINT (128 + 2)


def _only_hydra_files(run_dir: str) -> bool:
    """True if `run_dir` holds nothing but what Hydra and the lock wrote for this job."""
    try:
        entries = os.listdir(run_dir)
    except FileNotFoundError:
        return True
    return all(e in (".hydra", ".lock", "plan_costs.json") or e.endswith(".log") for e in entries)


def _first_missing(run_dir: str) -> str | None:
    """The outermost directory of `run_dir`'s path that does not exist yet (None: it exists)."""
    path, missing = os.path.abspath(run_dir), None
    while not os.path.exists(path):
        missing, path = path, os.path.dirname(path)
    return missing


def _remove_run_dir(run_dir: str, created: str | None) -> None:
    """Remove a run directory this job created (`created`: the outermost directory it made),
    and the folders above it that it made, if left empty.

    A directory with anything beyond Hydra's own files (checkpoints, TensorBoard logs,
    a summary) belongs to an earlier run: it is left alone.
    """
    if created is None or not _only_hydra_files(run_dir):
        return
    shutil.rmtree(run_dir, ignore_errors=True)
    path = os.path.dirname(os.path.abspath(run_dir))
    while len(path) >= len(created):
        try:
            os.rmdir(path)  # only succeeds when empty
        except OSError:
            return
        path = os.path.dirname(path)


def preflight(spec: RunSpec, run_dir: str, overrides: list[str]) -> tuple[Preflight, list[str]]:
    """Lock the run directory and check it against `resume`, writing nothing else; returns what
    was settled and the overrides Hydra gets (its run directory pinned, so a second that
    ticks over in between cannot move it).

    The lock comes first: a directory another run is using is refused naming that run, and
    its files are not even read.
    """
    from chain.config.hydra import quoted
    from chain.state import lock, manifest

    settings = spec.settings
    pinned = f"hydra.run.dir={quoted(run_dir, 'hydra.run.dir')}"  # refused here, before anything is written
    if settings.resume and not os.path.isdir(run_dir):
        manifest.require_some(run_dir)  # nothing there to lock
    created = _first_missing(run_dir)
    had_lock_file = os.path.exists(lock.path(run_dir))
    note = lock.acquire(run_dir, name_holder=False)
    try:
        manifest.require_some(run_dir) if settings.resume else manifest.require_none(run_dir)
    except ChainError:
        lock.release(run_dir, clear=False)
        if not had_lock_file and created is None:
            os.remove(lock.path(run_dir))  # leave the directory as it was found
        raise
    lock.announce(run_dir)
    atexit.register(lock.release, run_dir)  # a clean exit clears the holder; a killed run leaves its PID
    if note:
        spec = replace(spec, settings=replace(settings, notes=(*settings.notes, note)))
    extra = [pinned]
    if settings.resume:
        extra.append("hydra.output_subdir=null")  # keep the .hydra/ of the run being resumed
    return Preflight(spec, run_dir, created), [*overrides, *extra]


def _unit(mode: str) -> str:
    """What the placement's rows are: a chain's stages, or side by side's variants (independent models)."""
    return "variant" if mode == "side_by_side" else "stage"


def show_plan(spec: RunSpec, overrides: list[str] | None = None) -> None:
    """plan_only=true: print the placement and the plan (with placement.plan=auto, the best candidates
    and the command that runs the chosen one by hand, from the command line's `overrides`), write nothing
    (no run directory) but the schedule when `pipeline.schedule_out` asks for it."""
    import_tensorflow_quietly()
    from chain.training.build import build
    from chain.training.logs import assignment_table

    settings = spec.settings
    run = build(spec)
    print(assignment_table(run.assignment, run.stages, settings.notes, unit=_unit(settings.mode)))
    if run.assignment.footprints:
        from chain.planning import fit
        from chain.planning.inventory import Inventory

        print(
            fit.table(
                run.assignment, run.assignment.footprints, spec.inventory or Inventory(), unit=_unit(settings.mode)
            )
        )
    plan = run.strategy.plan_text(full=True)
    if plan:
        print(plan)
    if run.auto_plan is not None:
        from chain.autoplan import table

        print(table.render(run.auto_plan, overrides))
    out = settings.pipeline.schedule_out
    if out is not None and run.schedule is not None:
        from chain.errors import StorageError
        from chain.schedule import schedule_file

        try:
            schedule_file.write(run.schedule, out)
        except OSError as e:
            raise StorageError(f"pipeline.schedule_out={out!r} could not be written: {e.strerror or e}") from None
        print(f"schedule written to {out} (pipeline.schedule=file pipeline.schedule_file={out} runs it)")


@hydra.main(config_path="pkg://chain.conf", config_name="config", version_base="1.3")
def _app(cfg: DictConfig) -> None:
    run_dir = HydraConfig.get().runtime.output_dir
    quiet_third_party_logs()  # Hydra's logging set-up prints INFO: only chain's own, not the libraries'
    from chain.training.logfile import guard_all

    guard_all()  # the log on a full device: one StorageError line, not logging's tracebacks
    created = _preflight.created if _preflight else os.path.abspath(run_dir)
    run = None
    try:
        spec = _preflight.spec if _preflight else check_config(cfg)  # checked once
        settings = spec.settings
        import_tensorflow_quietly()
        from chain.training.build import build
        from chain.training.logs import assignment_table

        run = build(spec, run_dir)
        on_lost.announce(run)  # the lost worker this process goes on after, if any
        print(assignment_table(run.assignment, run.stages, settings.notes, unit=_unit(settings.mode)), flush=True)
        plan = run.strategy.plan_text(full=False)
        if plan:
            print(plan, flush=True)
        run.fit()
        summary = run.summary  # the typed record summary.json was written from
        if summary.side_by_side and summary.side_by_side.ranking:
            from chain.training.logs import ranking_table

            print(ranking_table(summary.side_by_side.ranking))
        print(f"done: {plural(summary.steps, 'step')}, summary in {os.path.join(run_dir, 'summary.json')}")
        if sweep.in_job():
            sweep.record_done(summary)  # the sweep's table of its jobs
    except ChainError as e:
        if isinstance(e, WorkerLost) and run is not None:
            on_lost.noted(run_dir, run, "")
        _remove_run_dir(run_dir, created)  # only if this job wrote nothing but Hydra's files
        if sweep.in_job():
            return sweep.record(str(e), e.exit_code)
        fail(str(e), e.exit_code)
    except KeyboardInterrupt:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl-C does not cut the message short
        _remove_run_dir(run_dir, created)
        print(_interrupted(run.global_step if run else None, run_dir), file=sys.stderr, flush=True)
        sys.exit(EXIT_INTERRUPTED)


def _interrupted(step: int | None, run_dir: str) -> str:
    """The one line for Ctrl-C: where training was, the newest complete checkpoint, how to resume."""
    from chain.config import override_key
    from chain.config.hydra import quoted
    from chain.state import manifest

    where = "before training started" if step is None else f"at step {step}"
    if not manifest.exists(run_dir):
        return f"interrupted {where}; no checkpoint had been saved in {run_dir}: nothing to resume"
    try:
        saved = manifest.read(run_dir)["step"]
    except ChainError as e:
        return f"interrupted {where}; {e}"
    overrides = HydraConfig.get().overrides
    dropped = ("resume", "hydra.run.dir", "hydra.output_subdir", "hydra.mode")  # set again below, or Hydra's
    kept = [o for o in [*overrides.task, *overrides.hydra] if override_key(o) not in dropped]
    try:
        pinned = f"hydra.run.dir={quoted(run_dir, 'hydra.run.dir')}"
    except ChainError:  # a directory Hydra cannot be given exactly: say it as it is
        pinned = f"hydra.run.dir={run_dir}"
    command = ["python", "-m", "chain", *kept, pinned, "resume=true"]
    return (
        f"interrupted {where}; the newest complete checkpoint is step {saved} ({run_dir}); "
        f"resume with: {shlex.join(command)}"
    )


def _supervise(spec: RunSpec, overrides: list[str], run_dir: str) -> int:
    """`cluster.on_lost=replan|wait`: the run directory checked and locked as for any run, the lock held
    across the training processes (`chain.training.on_lost`); a run that wrote nothing leaves no directory."""
    held, _ = preflight(spec, run_dir, overrides)
    code = on_lost.supervise(spec.settings, overrides, run_dir)
    if code:
        _remove_run_dir(run_dir, held.created)
    return code


def _hydra_flags(args: list[str]) -> bool:
    """True when the command line asks Hydra for more than one run (`-m`, `--cfg`, `--help`, ...)."""
    return any(a.startswith("-") for a in args)


_job_end: list = []  # under a scheduler: the client's chain.planning.job_end.JobEnd, told the exit code at the end


def main() -> None:
    """Entry point of `python -m chain` and the `chain` command."""
    code: int | str | None = 1
    try:
        _main()
        code = 0
    except SystemExit as e:
        code = e.code
        raise
    except BrokenPipeError:  # `python -m chain --help | head`: the reader left
        reader_left()
    finally:
        for ending in _job_end:  # the workers end with the job, with its exit code
            ending.end(code if isinstance(code, int) else (0 if code is None else 1))


def _scheduled(settings: Settings) -> None:
    """Under a scheduler: `cluster.launcher=slurm` gives each task its GPUs and makes every task but
    the first a worker (this call then never returns); the client (Slurm's task 0, TF_CONFIG's chief)
    listens where its workers look for it, to tell them when the job ends."""
    from chain.planning import cluster, job_end, slurm

    c = settings.cluster
    if c.launcher == "slurm" and not c.workers:
        job = slurm.job(os.environ, c.port_base)
        if job.visible_gpus is not None:  # before TensorFlow is imported: it reads it once
            os.environ["CUDA_VISIBLE_DEVICES"] = job.visible_gpus
        if job.task > 0:
            from chain.worker import serve

            serve(job.task - 1, job.workers, job.client, c.wait_s)
    found = cluster.client_address(c)
    if found is not None:
        ending = job_end.JobEnd(*found)
        ending.start()
        _job_end.append(ending)


def _main() -> None:
    global _preflight
    args = sys.argv[1:]
    multirun = False
    try:
        overrides = normalize_overrides(args)
        if not _hydra_flags(args):
            from chain.config.hydra import check_job_name, compose_config

            cfg = compose_config(overrides, with_hydra=True)
            check_job_name(cfg)
            spec = check_config(cfg)  # every config error that needs no TensorFlow
            settings = spec.settings
            _scheduled(settings)
            if settings.plan_only:
                return show_plan(spec, overrides)
            if on_lost.supervises(settings):  # the training runs in fresh processes of this command
                sys.exit(_supervise(spec, overrides, str(cfg.hydra.run.dir)))
            _preflight, overrides = preflight(spec, str(cfg.hydra.run.dir), overrides)
        else:
            from chain.config.hydra import check_flag_order

            check_flag_order(args)
            flags = [a for a in args if a.startswith("-")]
            multirun = all(a in ("-m", "--multirun") for a in flags)  # other flags (--cfg, -cn, ...): Hydra's own
            if multirun:
                sweep.check_jobs([o for o in overrides if not o.startswith("-")])
    except ChainError as e:
        fail(str(e), e.exit_code)
    sys.argv = [sys.argv[0], *overrides]
    sweep.run(_app) if multirun else _app()


if __name__ == "__main__":
    main()
