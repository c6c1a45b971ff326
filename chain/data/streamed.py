"""What every streamed data set (`data.stream=true`, `chain.data.loader.Dataset.shards`) is to the
run, declared once: `Streamed`, the interface its record implements (each source's record, made by
its `shards` without TensorFlow, opens its own `tf.data` stream), and what the file streams share:
`FileCounts` (the files and the examples each holds), `stream_files` and `held_files` (validation
without a file of its own: whole files held out, the last ones in sorted order, the same on every
run) and `none_empty`. No TensorFlow here: a record imports its stream module when a stream is opened.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, ClassVar

from chain.data.catalog import split_size, val_fraction
from chain.data.paths import matching
from chain.errors import ConfigError

# The roles of the files a stream reads (`Streamed.files_read`), as a checkpoint records them.
TRAIN, VAL, VOCABULARY = "train", "val", "vocabulary"


class Streamed(ABC):
    """A data set read while training: its record (the source's files, counts and settings) and how
    it opens its streams. Every method the run calls on a streamed data set is declared here, with
    its default where a source has nothing to add. The streams are `tf.data.Dataset`s of
    `(x, {target: y})` batches."""

    # Whether mirrored replicas read their own shares of its files (`training`'s `share`).
    SHARES: ClassVar[bool] = False

    @property
    @abstractmethod
    def examples(self) -> int:
        """Training examples in an epoch."""

    @abstractmethod
    def training(self, batch: int, shuffle: bool, seed: int, skipped: Any = None, share: tuple[int, int] | None = None):
        """The endless stream of training batches of `batch` examples, shuffled with `seed`; bad
        records counted in `skipped` (`skip_counter`) or stopping it; `share=(r, R)`: replica r's
        files of R (only where `SHARES`)."""

    @abstractmethod
    def validation(self, batch: int, skipped: Any = None):
        """The validation examples once, in order, in batches of at most `batch`; None without any."""

    def skip_counter(self) -> Any:
        """The count of bad records left out (`data.on_bad_record=skip`, a `tf.Variable`), or None
        when a bad record stops the run (or the source has none)."""
        return None

    def bad_record(self, error: BaseException) -> str | None:
        """The one line for a bad record that stopped the stream (naming its file), or None when
        `error` is not one."""
        return None

    def files_read(self) -> list[tuple[str, str, str]]:
        """(path, key, role: TRAIN, VAL or VOCABULARY) of every file the stream's identity is made
        of, training files first (`chain.data.identity`); empty: no files of ours (the user's dataset)."""
        return []

    def check_ids(self, data: Any, vocab: int, target: str, ignored: int | None = None) -> Streamed:
        """The ids of `model=gpt`'s inputs and `target` (whose labels may also be `ignored`, `ignore_class`)
        within `[0, vocab)`: checked here where they can be read before training, else by the stream
        returned as it reads them (`chain.data.token_ids.check`); by default they are not."""
        return self


def refuse_share(share: tuple[int, int] | None) -> None:
    """A stream that is not read in replicas' shares given one (refused before training by
    `chain.data.stream_shares.check_files`)."""
    if share is not None:
        raise ValueError("only TFRecord streams are read in replicas' shares")


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

    TRAIN_KEY: ClassVar[str] = "data.path"  # the glob of the training files; a subclass's `val_key` the validation's

    def key(self, path: str) -> str:
        """The key whose glob matched `path` (for error lines)."""
        return self.val_key if path in self.val_paths else self.TRAIN_KEY

    def files_read(self) -> list[tuple[str, str, str]]:
        """Every file, training files first (`Streamed.files_read`)."""
        return [(p, self.TRAIN_KEY, TRAIN) for p in self.paths] + [(p, self.key(p), VAL) for p in self.val_paths]


def held_files(paths: list[str], fraction: float, key: str, pattern: str) -> tuple[list[str], list[str]]:
    """`paths` split into training and validation files: the last `round(len x fraction)` (at least
    one) held out; one line naming `key` when the glob matches too few files to hold any out."""
    held = split_size(len(paths), fraction)
    if fraction > 0 and not held:
        raise ConfigError(
            f"data.val_fraction={fraction:g} with data.stream=true holds out whole files, and "
            f"{key}={pattern!r} matches {len(paths)} file; give data.val_path, or data.val_fraction=0 "
            "(no validation)"
        )
    return paths[: len(paths) - held], paths[len(paths) - held :]


def stream_files(data: Any) -> tuple[list[str], list[str], str]:
    """A stream of files' training and validation files and the key that names the validation files:
    the glob `data.val_path`, or the last whole files of the glob `data.path` (`held_files`)."""
    paths = matching(data.path, "data.path")
    if data.val_path is not None:
        return paths, matching(data.val_path, "data.val_path"), "data.val_path"
    paths, val = held_files(paths, val_fraction(data), "data.path", data.path)
    return paths, val, "data.path"


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
