"""The files a streamed data set reads (`data.stream=true`), as a run's checkpoints record them: made
at start by `chain.data.identity`, kept in every checkpoint's record (`chain.state.checkpoints.Record`)
and compared on resume, so that a stream never resumes over files that changed."""

from __future__ import annotations

from dataclasses import dataclass

from chain.records.serial import item


@dataclass(frozen=True)
class FileStamp:
    """One file of a stream as it was when the run (or its last resume) started."""

    path: str = item("the file, as its key's glob (or path) gave it")
    key: str = item(
        "the key that names it: data.path, data.val_path or data.tokenizer (data.files, data.val_files in older checkpoints)"
    )
    role: str = item("what the run reads it for: train, val or vocabulary (data.tokenizer's files)")
    size: int = item("its size in bytes")
    mtime_ns: int = item("its modification time, in ns since the epoch")
    digest: str = item("'SCHEME:hex': sha256 of the whole file (whole) or of blocks spread over it (e.g. 16x4096)")


@dataclass(frozen=True)
class StreamFiles:
    """Every file a streamed data set reads, in the stream's order (training files, then validation)."""

    files: list[FileStamp] | None = item("the stream's files (null: not recorded, a checkpoint from before)")
