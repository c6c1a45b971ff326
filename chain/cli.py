"""What every command of the package shares: one-line errors and a quiet TensorFlow import."""

from __future__ import annotations

import logging
import os
import sys
from typing import NoReturn

EXIT_USAGE = 2

# TensorFlow's lines that are known harmless, as (what the line holds, ...) per line; each says why.
HARMLESS = (
    # A checkpoint whose variables live on more than one task (stages on cluster workers, with the client's
    # save counter and data iterator) is saved through a tf.function that TensorFlow 2.21 makes anew for every
    # eager save, on purpose (`MultiDeviceSaver.save`: "the retrace is needed"); from the fifth save of a
    # process on, each save warns. Nothing of chain's retraces.
    ("MultiDeviceSaver.save.<locals>.tf_function_save", "triggered tf.function retracing"),
)


# The loggers of the libraries under chain. Hydra's logging set-up (a command line's) puts the root logger at INFO,
# which their INFO lines would then reach: matplotlib's font cache on a fresh machine, TensorFlow's checkpoint shards
# (through absl), a mirrored step's "Reduce to ... then broadcast to". They stay at WARNING, as without Hydra.
THIRD_PARTY = (
    "absl",
    "tensorflow",
    "keras",
    "keras_hub",
    "matplotlib",
    "PIL",
    "h5py",
    "urllib3",
    "filelock",
    "fsspec",
    "huggingface_hub",
)


def fail(message: str, code: int = EXIT_USAGE) -> NoReturn:
    """Print one readable line and exit non-zero."""
    print(f"error: {message}", file=sys.stderr)
    sys.exit(code)


def reader_left() -> NoReturn:
    """Exit 1 without a traceback when stdout's reader has gone (`... | head`): what is still buffered for it
    goes nowhere, so Python's own flush at exit fails no more."""
    os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    sys.exit(1)


def quiet_environment() -> None:
    """Set TensorFlow's C++ log level for chain's processes, unless the user set one: read once,
    when TensorFlow is imported, so this must come first (`import chain` calls it).

    Level 3 keeps FATAL lines only. TensorFlow's C++ ERROR lines in a run are either the text of
    an error that reaches Python as an exception, which chain prints in its own line, or notes of
    something TensorFlow recovers from by itself: Grappler skipping a pass it cannot apply
    (`layout failed: INVALID_ARGUMENT: The graph couldn't be sorted in topological order`, on the
    steps of `trainer.grad_accum` > 1, whose constant folding and arithmetic passes leave a graph
    the later passes cannot sort; the step runs as written), a lost worker's gRPC errors (chain
    says which worker in one line), the start-up probe for a GPU (`failed call to cuInit`).
    """
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")


class _Harmless(logging.Filter):
    """Drops the records of TensorFlow's logger that `HARMLESS` lists; passes every other."""

    def filter(self, record: logging.LogRecord) -> bool:
        text = record.getMessage()
        return not any(all(part in text for part in parts) for parts in HARMLESS)


def quiet_tensorflow_logs() -> None:
    """Keep `HARMLESS`'s lines out of TensorFlow's Python logger (`tensorflow`), once per process."""
    logger = logging.getLogger("tensorflow")
    if not any(isinstance(f, _Harmless) for f in logger.filters):
        logger.addFilter(_Harmless())


def quiet_third_party_logs() -> None:
    """Keep `THIRD_PARTY`'s loggers at WARNING: call it where chain's command line configures logging (after
    Hydra's set-up); chain's own logger (`chain`) and the user's keep their levels."""
    for name in THIRD_PARTY:
        logging.getLogger(name).setLevel(logging.WARNING)


def import_tensorflow_quietly() -> None:
    """Import TensorFlow with its C++ start-up notices (oneDNN, CPU features) hidden, and its known
    harmless log lines (`HARMLESS`) filtered out (also when TensorFlow was imported before).

    The notices are written by absl before TF_CPP_MIN_LOG_LEVEL is read, so only silencing
    file descriptor 2 during the import removes them; an import that fails shows them.
    """
    import tempfile

    quiet_tensorflow_logs()
    quiet_environment()
    # TensorFlow's plain CPU allocator keeps no statistics (its BFC allocator does, and is the
    # default only where oneDNN is on, e.g. recent Intel CPUs): without them the peak memory per
    # stage would be missing on other CPUs. Read once, when the runtime starts.
    os.environ.setdefault("TF_CPU_ALLOCATOR_USE_BFC", "true")
    if "tensorflow" in sys.modules:
        return  # imported already (its notices, if any, are printed)
    saved = os.dup(2)
    with tempfile.TemporaryFile(mode="w+b") as sink:
        os.dup2(sink.fileno(), 2)
        try:
            import tensorflow  # noqa: F401
        except Exception:  # not Ctrl-C: the import did not fail, it was stopped
            os.dup2(saved, 2)
            sink.seek(0)
            sys.stderr.write(sink.read().decode(errors="replace"))
            raise
        finally:
            os.dup2(saved, 2)
            os.close(saved)
