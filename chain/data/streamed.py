"""What a streamed CSV, `.npz` or callable data set reads (`data.stream=true`), as typed records
made by its source without TensorFlow (`chain.data.sources`) and read by its `tf.data` stream
(`chain.data.csv_stream`, `chain.data.array_stream`, `chain.data.function_stream`). TFRecord
files have their own record, `chain.data.shards.Shards`.

`held_files` is the rule every file stream shares for validation without a file of its own: whole
files held out, the last ones in sorted order, the same on every run.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from chain.data.catalog import DataInfo, split_size
from chain.data.files import Member
from chain.data.shards import FileCounts
from chain.errors import ConfigError


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


@dataclass(frozen=True)
class CsvFiles(FileCounts):
    """CSV files streamed (`data=csv data.stream=true`): training `paths` and validation `val_paths`,
    each file's row count, their shared header (`columns`), the input columns' indices (`x`), the
    targets as (name, column index, classes: 0 for a value), the shuffle buffer in examples and
    whether bad rows are left out (`skip_bad`); `val_key` names the validation files' key."""

    columns: tuple[str, ...]
    x: tuple[int, ...]
    targets: tuple[tuple[str, int, int], ...]
    shuffle_buffer: int
    skip_bad: bool = False
    TRAIN_KEY: ClassVar[str] = "data.path"
    val_key: str = TRAIN_KEY


@dataclass(frozen=True)
class ArrayPart:
    """Rows `start`..`stop` of an `.npz` file's arrays read in place: the inputs `x` and each target
    (in the targets' order), every one a `chain.data.files.Member` of one file."""

    x: Member
    ys: tuple[Member, ...]
    start: int
    stop: int

    @property
    def rows(self) -> int:
        return self.stop - self.start


@dataclass(frozen=True)
class ArrayFiles:
    """An `.npz` data set streamed (`data=npz data.stream=true`): the training rows (`train`), the
    validation rows (`val`, None: none), the targets as (name, classes: 0 for a value), the rows
    read as one block (`block`: blocks are what is shuffled per epoch and read several at a time)
    and the shuffle buffer in examples."""

    train: ArrayPart
    val: ArrayPart | None
    targets: tuple[tuple[str, int], ...]
    block: int
    shuffle_buffer: int

    @property
    def examples(self) -> int:
        return self.train.rows

    @property
    def val_examples(self) -> int:
        return self.val.rows if self.val else 0


@dataclass(frozen=True)
class FunctionData:
    """The user's `tf.data.Dataset` streamed as it is (`data=callable data.stream=true`): the dataset
    of single examples (`dataset`, a `tf.data.Dataset`), its target names in order (None: a bare y),
    the description (`info`: shapes from its element spec, classes from `data.classes`, size from
    `data.examples` or a count), the first `held` examples kept for validation, the shuffle buffer,
    and what names it in error lines (`what`)."""

    dataset: Any
    names: tuple[str | None, ...]
    info: DataInfo
    held: int
    shuffle_buffer: int
    what: str


@dataclass(frozen=True)
class TokenPart:
    """Tokens `start`..`stop` of the ids of `paths` one after the other (each file `sizes[k]` ids of NumPy
    `dtype`; one file for `data=tokens`, a glob's UTF-8 files as bytes for `data=text`), cut into windows
    of `seq_len + 1` tokens (the inputs and, one token on, their targets): `windows` of them."""

    paths: tuple[str, ...]
    sizes: tuple[int, ...]
    dtype: str
    start: int
    stop: int
    seq_len: int

    @property
    def windows(self) -> int:
        """Whole windows the part holds at a stride of `seq_len` (each needs one more token)."""
        return max(0, (self.stop - self.start - 1) // self.seq_len)


@dataclass(frozen=True)
class Tokenized:
    """What a tokenizer's token files were made from (`data=text data.tokenizer`): the training texts
    (`texts`), the validation texts (`val_texts`, `data.val_files`; empty: held out of the training
    texts' ids) and the vocabulary's files. They are the stream's identity, not the ids' files in the
    user's cache, which a cleared cache, another `$HOME` or another machine makes again."""

    texts: tuple[str, ...]
    val_texts: tuple[str, ...]
    vocabulary: tuple[str, ...]
    VOCABULARY_KEY: ClassVar[str] = "data.tokenizer"


@dataclass(frozen=True)
class TokenFiles:
    """Token files streamed (`data=tokens`, `data=text`): the training tokens (`train`), the validation tokens
    (`val`, None: none), the vocabulary (`vocab`: ids 0..vocab-1) and how training windows are
    drawn (`windows`: `sequential`, every window of the part at a stride of seq_len, in order or
    shuffled per epoch; `random`, each starting at a random token, as nanoGPT's `get_batch`);
    `made_from`: the texts and vocabulary a tokenizer made the files of (None: the files are the data)."""

    train: TokenPart
    val: TokenPart | None
    vocab: int
    windows: str
    TRAIN_KEY: str = "data.path"  # what names the training files, and the validation files
    val_key: str = "data.val_path"
    made_from: Tokenized | None = None
    TARGET: ClassVar[str] = "next"  # the target: the next token at every position

    @property
    def examples(self) -> int:
        return self.train.windows
