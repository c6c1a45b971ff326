"""`python -m chain [overrides]`: the Hydra command line.

Errors the user can fix (`ChainError`) print one line and exit 2; a run that fails
before training leaves no run directory behind.
"""

from __future__ import annotations

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


def fail(message: str) -> None:
    """Print one readable line and exit non-zero."""
    print(f"error: {message}", file=sys.stderr)
    sys.exit(EXIT_USAGE)


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


def _remove_run_dir(run_dir: str) -> None:
    """Remove a run directory this job created, and its date folder if left empty."""
    shutil.rmtree(run_dir, ignore_errors=True)
    parent = os.path.dirname(run_dir)
    try:
        os.rmdir(parent)  # only succeeds when empty
    except OSError:
        pass


@hydra.main(config_path="pkg://chain.conf", config_name="config", version_base="1.3")
def _app(cfg: DictConfig) -> None:
    from chain.config import settings

    import logging

    logging.getLogger("absl").setLevel(logging.WARNING)  # per-save "sharding callback" chatter
    run_dir = HydraConfig.get().runtime.output_dir
    resume = bool(cfg.get("resume", False))
    trained = False
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
        trained = True
        summary = run.fit()
        print(f"done: {summary['steps']} steps, summary in {os.path.join(run_dir, 'summary.json')}")
    except ChainError as e:
        if not trained and not resume:
            _remove_run_dir(run_dir)
        fail(str(e))


def main() -> None:
    """Entry point of `python -m chain` and the `chain` command."""
    try:
        sys.argv = [sys.argv[0]] + normalize_overrides(sys.argv[1:])
    except ChainError as e:
        fail(str(e))
    _app()


if __name__ == "__main__":
    main()
