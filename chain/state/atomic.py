"""Writing the run's files: atomically (a reader sees the old file or the whole new one, never
a torn one), and with failures (disk full, read-only, gone) as one `StorageError` line."""

from __future__ import annotations

import json
import os
from contextlib import contextmanager
from typing import Any, Iterator

from chain.errors import StorageError


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


@contextmanager
def writing(what: str) -> Iterator[None]:
    """Turn a failed write inside the block (OSError, or TensorFlow's errors of file access)
    into one `StorageError` line: "cannot write WHAT: reason"."""
    import tensorflow as tf

    try:
        yield
    except (OSError, tf.errors.PermissionDeniedError, tf.errors.NotFoundError, tf.errors.FailedPreconditionError,
            tf.errors.ResourceExhaustedError, tf.errors.UnknownError) as e:
        reason = (getattr(e, "strerror", None) or getattr(e, "message", None) or str(e)).strip().splitlines()
        raise StorageError(f"cannot write {what}: {reason[0] if reason else type(e).__name__}") from None
