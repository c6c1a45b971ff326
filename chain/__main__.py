"""`python -m chain [overrides]`: the Hydra command line.

Errors the user can fix (`ChainError`) print one line and exit 2 (3 when training
stopped on a non-finite loss or gradient); a run that fails before training leaves no
run directory behind, and a directory that already held a run is never removed.
"""

from __future__ import annotations

import logging
import os
import shutil
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from chain.config import normalize_overrides
from chain.errors import ChainError

EXIT_USAGE = 2


def fail(message: str, code: int = EXIT_USAGE) -> None:
    """Print one readable line and exit non-zero."""
    print(f"error: {message}", file=sys.stderr)
    sys.exit(code)


def _import_tensorflow_quietly() -> None:
    """Import TensorFlow with its C++ start-up notices (oneDNN, CPU features) hidden.

    They are written by absl before TF_CPP_MIN_LOG_LEVEL is read, so only silencing
    file descriptor 2 during the import removes them; an import that fails shows them.
    """
    import tempfile

    saved = os.dup(2)
    with tempfile.TemporaryFile(mode="w+b") as sink:
        os.dup2(sink.fileno(), 2)
        try:
            import tensorflow  # noqa: F401
        except BaseException:
            os.dup2(saved, 2)
            sink.seek(0)
            sys.stderr.write(sink.read().decode(errors="replace"))
            raise
        finally:
            os.dup2(saved, 2)
            os.close(saved)


def _only_hydra_files(run_dir: str) -> bool:
    """True if `run_dir` holds nothing but what Hydra wrote for this job (`.hydra/`, the log)."""
    try:
        entries = os.listdir(run_dir)
    except FileNotFoundError:
        return True
    return all(e == ".hydra" or e.endswith(".log") for e in entries)


def _remove_run_dir(run_dir: str) -> None:
    """Remove a run directory this job created, and its date folder if left empty.

    A directory with anything beyond Hydra's own files (checkpoints, TensorBoard logs,
    a summary) belongs to an earlier run, for example one `hydra.run.dir=...` points
    at: it is left alone.
    """
    if not _only_hydra_files(run_dir):
        return
    shutil.rmtree(run_dir, ignore_errors=True)
    parent = os.path.dirname(run_dir)
    try:
        os.rmdir(parent)  # only succeeds when empty
    except OSError:
        pass


@hydra.main(config_path="pkg://chain.conf", config_name="config", version_base="1.3")
def _app(cfg: DictConfig) -> None:
    from chain.config import settings

    run_dir = HydraConfig.get().runtime.output_dir
    # TensorFlow's checkpoint writer logs every shard at INFO through absl, which
    # Hydra's logging set-up would print on every save.
    logging.getLogger("absl").setLevel(logging.WARNING)
    try:
        settings(cfg)  # the schema check, before TensorFlow is imported
        _import_tensorflow_quietly()
        from chain.logs import placement_table, schedule_text
        from chain.run import build

        run = build(cfg, run_dir)
        print(placement_table(run.placement, run.stages), flush=True)
        if run.schedule is not None:
            print(schedule_text(run, full=run.settings["plan_only"]), flush=True)
        if run.settings["plan_only"]:
            _remove_run_dir(run_dir)
            return
        summary = run.fit()
        print(f"done: {summary['steps']} steps, summary in {os.path.join(run_dir, 'summary.json')}")
    except ChainError as e:
        _remove_run_dir(run_dir)  # only if this job wrote nothing but Hydra's files
        fail(str(e), e.exit_code)


def main() -> None:
    """Entry point of `python -m chain` and the `chain` command."""
    try:
        sys.argv = [sys.argv[0]] + normalize_overrides(sys.argv[1:])
    except ChainError as e:
        fail(str(e))
    _app()


if __name__ == "__main__":
    main()
