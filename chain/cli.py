"""What every command of the package shares: one-line errors and a quiet TensorFlow import."""

from __future__ import annotations

import os
import sys
from typing import NoReturn

EXIT_USAGE = 2


def fail(message: str, code: int = EXIT_USAGE) -> NoReturn:
    """Print one readable line and exit non-zero."""
    print(f"error: {message}", file=sys.stderr)
    sys.exit(code)


def import_tensorflow_quietly() -> None:
    """Import TensorFlow with its C++ start-up notices (oneDNN, CPU features) hidden.

    They are written by absl before TF_CPP_MIN_LOG_LEVEL is read, so only silencing
    file descriptor 2 during the import removes them; an import that fails shows them.
    """
    import tempfile

    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    # TensorFlow's plain CPU allocator keeps no statistics (its BFC allocator does, and is the
    # default only where oneDNN is on, e.g. recent Intel CPUs): without them the peak memory per
    # stage would be missing on other CPUs. Read once, when the runtime starts.
    os.environ.setdefault("TF_CPU_ALLOCATOR_USE_BFC", "true")
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
