"""A stream's files are part of its identity (`data.stream=true`): what a run records of each file it
streams, and what a resume finds changed. No TensorFlow.

At start a streamed run stamps every file it reads (`stamps`; for a tokenizer's ids, the texts and
the vocabulary they were made from, not the user's cache of them, which can be made again): its
size, its modification time and a sha256 digest, of the whole file up to `WHOLE` bytes (64 KiB) and
above that of `BLOCKS` blocks of
`BLOCK` bytes spread evenly over it (the first at its start, the last at its end): 64 KiB read a file
either way. A whole digest of a large file would read it all at every start (a 100 GB data set:
minutes; 8 files of 0.6 MB already cost 0.6% of a 1000-step run of the default model, measured),
and a file rewritten with other values differs in every block. What a sample cannot see (some
bytes of a large file changed in place, its size and modification time put back) is said in
docs/your-data.md. The checkpoints keep the stamps (`chain.records.stream_files`), and a resume
compares them with its own (`changes`): a file added, removed, moved between training and
validation, resized or rewritten is refused in one line (`refusal`), unless
`checkpoint.accept_changed_files=true`, which restarts the stream (`accepted`, the note that says so).
A file whose modification time alone changed is unchanged when its digest is of the whole file (its
bytes are the same), and rewritten when the digest is a sample (the rest may differ).
"""

from __future__ import annotations

import hashlib
import os
import time
from dataclasses import dataclass

from chain.data.streamed import TRAIN, VAL, VOCABULARY, Streamed
from chain.errors import ConfigError, plural
from chain.records.stream_files import FileStamp, StreamFiles

BLOCKS, BLOCK = 16, 4096  # a file is digested from 16 blocks of 4 KiB spread over it ...
WHOLE = BLOCKS * BLOCK  # ... or whole when that reads no more (64 KiB): no file costs more than 64 KiB read
_READ = {TRAIN: "read for training", VAL: "held out for validation", VOCABULARY: "read as data.tokenizer's vocabulary"}
OVERRIDE = "checkpoint.accept_changed_files"


def scheme(size: int) -> str:
    """How a file of `size` bytes is digested: 'whole', or 'BLOCKSxBLOCK' (sampled)."""
    return "whole" if size <= WHOLE else f"{BLOCKS}x{BLOCK}"


def digest(path: str, size: int) -> str:
    """'SCHEME:hex' of the file `path` of `size` bytes (`scheme`)."""
    h = hashlib.sha256()
    how = scheme(size)
    with open(path, "rb") as f:
        if how == "whole":
            h.update(f.read())
        else:
            for i in range(BLOCKS):
                h.update(os.pread(f.fileno(), BLOCK, i * (size - BLOCK) // (BLOCKS - 1)))
    return f"{how}:{h.hexdigest()}"


def stamp(path: str, key: str, role: str) -> FileStamp:
    """The stamp of one file (one line naming `key` when it cannot be read)."""
    try:
        st = os.stat(path)
        return FileStamp(path, key, role, st.st_size, st.st_mtime_ns, digest(path, st.st_size))
    except OSError as e:
        raise ConfigError(f"{key}: {path} cannot be read ({e.strerror or e})") from None


def stamps(shards: Streamed) -> StreamFiles | None:
    """The stamps of the files a streamed data set (`chain.data.loader.Dataset.shards`) reads; None
    for data that is not streamed from files (loaded, or the user's dataset)."""
    found = shards.files_read()
    return StreamFiles([stamp(*f) for f in found]) if found else None


@dataclass(frozen=True)
class Change:
    """One file that differs between a checkpoint's stamps and the files now: `what` happened to it
    (added, removed, moved, resized, rewritten), said in `detail`."""

    key: str
    path: str
    what: str
    detail: str

    def line(self) -> str:
        return f"{self.key}: {self.path} {self.detail}"


_ORDER = ("added", "removed", "moved", "resized", "rewritten")  # the cause first: an added file moves others


def _when(ns: int) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ns / 1e9))


def _compare(old: FileStamp, new: FileStamp) -> Change | None:
    if old.role != new.role:
        return Change(new.key, new.path, "moved", f"was {_READ[old.role]} and is now {_READ[new.role]}")
    if old.size != new.size:
        return Change(new.key, new.path, "resized", f"was resized ({old.size} -> {new.size} bytes)")
    how_old, _, _ = old.digest.partition(":")
    how_new, _, _ = new.digest.partition(":")
    if how_old == how_new and old.digest != new.digest:
        return Change(new.key, new.path, "rewritten", f"was rewritten (the same {new.size} bytes, other contents)")
    if old.mtime_ns != new.mtime_ns and not (how_old == how_new == "whole"):
        return Change(
            new.key,
            new.path,
            "rewritten",
            f"was modified (at {_when(new.mtime_ns)}, not {_when(old.mtime_ns)}; the same size and sampled "
            "bytes, the rest unknown)",
        )
    return None


def changes(saved: StreamFiles, now: StreamFiles) -> list[Change]:
    """What changed between the files a checkpoint recorded (`saved`) and the files now, the cause
    first: added, removed, moved between training and validation, resized, rewritten."""
    old = {f.path: f for f in saved.files or ()}
    new = {f.path: f for f in now.files or ()}
    found = [Change(f.key, p, "added", "was added") for p, f in new.items() if p not in old]
    found += [Change(f.key, p, "removed", "was removed") for p, f in old.items() if p not in new]
    found += [c for p in new if p in old and (c := _compare(old[p], new[p])) is not None]
    return sorted(found, key=lambda c: _ORDER.index(c.what))  # stable: each kind in the stream's order


def _more(found: list[Change]) -> str:
    n = len(found) - 1
    return f" (and {plural(n, 'more file')} changed)" if n else ""


def refusal(found: list[Change], step: int) -> str:
    """The one line that refuses a resume over changed files (`found` not empty)."""
    return (
        f"{found[0].line()} since the checkpoint of step {step} recorded the stream's files{_more(found)}: a "
        f"stream resumes only over the files it was reading; put them back, or resume with {OVERRIDE}=true to "
        "train on them as they are now (the stream then restarts)"
    )


def accepted(found: list[Change], step: int) -> str:
    """The note of a resume that takes changed files on purpose (`checkpoint.accept_changed_files=true`)."""
    return (
        f"note: {OVERRIDE}=true: {found[0].line()} since step {step}{_more(found)}; the stream restarts at "
        f"step {step + 1} with the first batch of a new stream over the files as they are now (the position "
        f"saved at step {step} and the batches it had read ahead are dropped)"
    )
