"""Atomic file writes: a reader sees the old file or the whole new one, never a torn one."""

from __future__ import annotations

import json
import os
from typing import Any


def write_text(path: str, text: str) -> None:
    """Write `text` to a temporary file, flush it to disk, then rename it over `path`."""
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())  # the rename must not land before the bytes do
    os.replace(tmp, path)


def write_json(path: str, obj: Any) -> None:
    """`obj` as indented JSON, written atomically."""
    write_text(path, json.dumps(obj, indent=2) + "\n")
