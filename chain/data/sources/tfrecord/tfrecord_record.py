"""A data set streamed from files rather than loaded (`data.stream=true`): which files, how their
records parse, and how many records each holds. No TensorFlow: the preparation pass makes it
(`chain.data.sources.tfrecord_data.shards`) and `chain.data.record_stream` reads it.

Validation without `data.val_files` holds out whole files, the last ones in sorted order: the
same files on every run, never a random subset of records that would change between runs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from chain.data import count_cache, tfrecord_files
from chain.errors import ConfigError


@dataclass(frozen=True)
class FileCounts:
    """The files a stream reads and the examples each holds: training `paths` with `counts`, and
    validation `val_paths` (empty: none) with `val_counts`. What every file stream's record shares."""

    paths: tuple[str, ...]
    counts: tuple[int, ...]
    val_paths: tuple[str, ...]
    val_counts: tuple[int, ...]

    @property
    def examples(self) -> int:
        """Training examples in all the files."""
        return sum(self.counts)

    @property
    def val_examples(self) -> int:
        """Validation examples in all the files."""
        return sum(self.val_counts)

    TRAIN_KEY: ClassVar[str]  # the key whose glob names the training files; a subclass's `val_key` the validation's

    def key(self, path: str) -> str:
        """The key whose glob matched `path` (for error lines)."""
        return self.val_key if path in self.val_paths else self.TRAIN_KEY


@dataclass(frozen=True)
class Shards(FileCounts):
    """Files streamed in a run: training `paths` and validation `val_paths` (empty: none), each
    file's record count (`counts`, `val_counts`), the features to parse (`features`: name ->
    (dtype, shape), as `data.features`), the input feature `x`, the targets as (name, feature,
    classes), the shuffle buffer in examples and whether bad records are left out (`skip_bad`,
    `data.on_bad_record=skip`) or stop the run; `val_key` is the key that names the validation
    files (`data.val_files`, or `data.files` when they are held out of it)."""

    features: tuple[tuple[str, tuple], ...]
    x: str
    targets: tuple[tuple[str, str, int], ...]
    shuffle_buffer: int
    skip_bad: bool = False
    TRAIN_KEY: ClassVar[str] = "data.files"
    val_key: str = TRAIN_KEY


def count(paths: list[str], key: str) -> tuple[int, ...]:
    """The records of each file (`key` names the glob, for error lines), counted from the files'
    framing (a pass, logged), or read from the count cache (`chain.data.count_cache`)."""
    return count_cache.counts(paths, key, "tfrecord records", lambda p: tfrecord_files.whole_records(p, key))


def none_empty(paths: list[str], counts: tuple[int, ...], key: str, what: str, held: bool = False) -> None:
    """One line naming the first of `paths` that holds no `what` (`key` names their glob; `held`:
    they are the validation files held out of it). An empty file is refused before training: an
    empty validation set has no loss to report, and an empty training file is no file of the data."""
    for path, n in zip(paths, counts):
        if not n:
            role = (
                f", and it is held out for validation (the last {len(paths)} file(s) of {key} in sorted order)"
                if held
                else ""
            )
            raise ConfigError(
                f"{key}: {path} holds no {what}{role}; every file streamed holds at least one: remove "
                f"it, or change {key}"
            )
