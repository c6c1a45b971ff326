"""What stops a run, in one line: the failures of `Run.fit` translated into chain's errors.

Each error says what happened and what survives (`intact`: the last complete checkpoint, and
how to go on), and keeps its exit code (`chain.errors`): a lost cluster worker
(`chain.planning.cluster.lost`), a bad record of a streamed data set (a `ConfigError`, 2), a
non-finite step under `trainer.on_nan=stop` (`NonFiniteError`, 3), a failing disk or a worker
gone during a save (`StorageError`, 4), an out-of-memory backoff at its floor (`OutOfMemory`, 6).
Anything else passes unchanged.
"""

from __future__ import annotations

import contextlib
from typing import Iterator, Sequence

from chain.data.loader import Dataset
from chain.data.stream import bad_record
from chain.errors import ChainError, ConfigError, OutOfMemory, StorageError
from chain.planning import cluster
from chain.state import manifest
from chain.steps.numerics import NonFiniteError


def intact(run_dir: str | None, hint: bool = True) -> str:
    """What survives if the run stops now, in words (for a one-line error); `hint`: and how to go on."""
    if not run_dir or not manifest.exists(run_dir):
        return "no checkpoint had been saved"
    try:
        step = manifest.read(run_dir)["step"]
    except ChainError:
        return "its checkpoint.json is damaged"
    return f"the last complete checkpoint (step {step}) is intact" + (": resume with resume=true" if hint else "")


@contextlib.contextmanager
def one_line(run_dir: str | None, dataset: Dataset, workers: Sequence[str], lost_after_s: float) -> Iterator[None]:
    """Around a run's training: its failures as one-line errors saying what survives in `run_dir`.

    `workers`: the addresses of the other processes a step needs (a cluster's, or a multi-worker
    run's peers; empty: none), whose loss explains a cancelled step or a failed save;
    `lost_after_s`: `cluster.lost_after_s`.
    """
    import tensorflow as tf

    try:
        yield
    except NonFiniteError as e:
        raise NonFiniteError(e.stages, e.step, f"; {intact(run_dir, hint=False)}") from None
    except (tf.errors.UnavailableError, tf.errors.CancelledError, tf.errors.AbortedError):
        if not workers:
            raise
        raise cluster.lost(workers, intact(run_dir), wait=lost_after_s) from None
    except tf.errors.OpError as e:
        bad = bad_record(e, dataset)
        if bad is None:
            raise
        raise ConfigError(f"{bad}; {intact(run_dir, hint=False)}") from None
    except (StorageError, OutOfMemory) as e:
        # a save that read a worker's variables as the worker went away: the worker is lost, not the disk
        gone = cluster.find_lost(workers, intact(run_dir)) if workers and isinstance(e, StorageError) else None
        if gone:
            raise gone from None
        if "last complete checkpoint" in str(e) or not run_dir:
            raise
        raise type(e)(f"{e}; {intact(run_dir, hint=False)}") from None
