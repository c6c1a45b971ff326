"""Writing the run's files: atomically (a reader sees the old file or the whole new one, never
a torn one), and with failures (disk full, read-only, gone) as one `StorageError` line."""

from __future__ import annotations

import errno
import json
import os
import signal
import threading
from contextlib import contextmanager
from typing import Any, Iterator

from chain.errors import StorageError, first_line


def write_text(path: str, text: str) -> None:
    """Write `text` to a temporary file, flush it to disk, then rename it over `path`."""
    tmp = f"{path}.tmp"
    try:
        with open(tmp, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())  # the rename must not land before the bytes do
        os.replace(tmp, path)
    except BaseException:
        try:
            os.remove(tmp)  # never leave a half-written temporary file behind
        except OSError:
            pass
        raise


def write_json(path: str, obj: Any) -> None:
    """`obj` as indented JSON, written atomically."""
    write_text(path, json.dumps(obj, indent=2) + "\n")


def reason(e: BaseException, file: bool = False) -> str:
    """Why a write failed, in one line that always names the cause: an OSError's
    `os.strerror(errno)` ("No space left on device", "File too large") even when its own text
    is something else (with its file name after it if `file`), or the first line of
    TensorFlow's message."""
    if isinstance(e, OSError) and e.errno:
        cause = os.strerror(e.errno)
        text = (e.strerror or "").strip()
        said = text if cause in text else f"{cause}{f' ({text})' if text else ''}"
        return said + (f" ({e.filename})" if file and e.filename else "")
    text = str(getattr(e, "message", None) or e).strip()
    first = first_line(e, typed=False)
    if isinstance(getattr(e, "errno", None), int) or any(os.strerror(n) in first for n in errno.errorcode):
        return first
    # TensorFlow puts the cause on a later line at times ("Failed to flush ...; File too large")
    causes = [os.strerror(n) for n in sorted(errno.errorcode) if os.strerror(n) in text]
    return f"{first} ({causes[0]})" if causes else first


@contextmanager
def writing(what: str) -> Iterator[None]:
    """Turn a failed write inside the block (OSError, or TensorFlow's errors of file access)
    into one `StorageError` line: "cannot write WHAT: reason"."""
    import tensorflow as tf

    try:
        yield
    except (
        OSError,
        tf.errors.PermissionDeniedError,
        tf.errors.NotFoundError,
        tf.errors.FailedPreconditionError,
        tf.errors.ResourceExhaustedError,
        tf.errors.OutOfRangeError,
        tf.errors.UnknownError,
    ) as e:
        # OutOfRangeError: TensorFlow's event writer on a file past the size limit (EFBIG)
        raise StorageError(f"cannot write {what}: {reason(e)}") from None


@contextmanager
def uninterrupted() -> Iterator[None]:
    """Hold off Ctrl-C (SIGINT) for the block: it takes effect (KeyboardInterrupt) when the block
    ends, so a save is never cut in half. Only the main thread receives signals; elsewhere the
    block runs as it is."""
    if threading.current_thread() is not threading.main_thread() or signal.getsignal(signal.SIGINT) is None:
        yield  # no signals here, or a handler not set from Python (which could not be put back)
        return
    pending: list[int] = []
    previous = signal.signal(signal.SIGINT, lambda signum, frame: pending.append(signum))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
    if pending:
        if callable(previous):
            previous(signal.SIGINT, None)  # Python's default handler raises KeyboardInterrupt
        elif previous == signal.SIG_DFL:
            raise KeyboardInterrupt
