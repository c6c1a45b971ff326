"""The run's log file (Hydra's `RUN_DIR/NAME.log`) on a file system that fails.

Python's logging reports a handler that cannot write by printing a traceback for every record
and going on. A log that cannot be written is a storage failure like a checkpoint that cannot be
written: `guard()` makes the first failed write stop the run with one `StorageError` line (exit 4)
that says why ("No space left on device"), and the log file is let go of, so nothing prints again.
"""

from __future__ import annotations

import logging
import os
import sys
import threading

from chain.errors import StorageError
from chain.state.atomic import reason


def _let_go(handler: logging.FileHandler) -> None:
    """Detach `handler` and close it without another failed write: what it still buffers goes to
    the null device (its file cannot take it; closing would fail again, at exit too)."""
    for logger in [logging.getLogger(), *logging.Logger.manager.loggerDict.values()]:
        if isinstance(logger, logging.Logger) and handler in logger.handlers:
            logger.removeHandler(handler)
    stream = handler.stream
    try:
        if stream is not None:
            null = os.open(os.devnull, os.O_WRONLY)
            os.dup2(null, stream.fileno())
            os.close(null)
        handler.close()
    except (OSError, ValueError):
        pass


def guard(handler: logging.FileHandler) -> None:
    """Make a failed write of `handler` one `StorageError` in the thread that logged (another
    thread's record prints the same line as a warning: it cannot stop the run)."""

    def failed(record: logging.LogRecord) -> None:
        error = sys.exc_info()[1]
        if not isinstance(error, OSError):
            return logging.FileHandler.handleError(handler, record)  # a bad record, not the file: as before
        _let_go(handler)
        line = f"cannot write the log {handler.baseFilename}: {reason(error)}"
        if threading.current_thread() is threading.main_thread():
            raise StorageError(line)
        print(f"warning: {line}; the run goes on without its log file", file=sys.stderr, flush=True)

    handler.handleError = failed  # type: ignore[method-assign]


def guard_all() -> None:
    """`guard` every file handler of the root logger (Hydra's job log)."""
    for handler in logging.getLogger().handlers:
        if isinstance(handler, logging.FileHandler):
            guard(handler)
