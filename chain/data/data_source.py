"""What every data source is made of, so that one source is one module of `chain.data.sources`:

- its settings, a frozen dataclass of the `data` section (`DataSet`, or `Labelled` for the
  user's data with named targets), its `KIND` (or `KINDS`) being the `data.name` that picks it;
- its description, `describe(data) -> DataInfo | None` (None: only TensorFlow can read it, so it
  is described from its arrays once they are read);
- its reader, `read(data, seed, info) -> Read`, given the description (None as above);
- optionally, for `data.stream=true`, `shards(data) -> chain.data.streamed.Streamed`: what a run
  streams instead of loading it, a record that opens its own stream (its settings then take the
  stream's keys from `StreamSettings`, or `BadRecords`).

`Source` holds these; `chain.data.sources` collects every module's (or folder's) `SOURCE`.
No TensorFlow here.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, ClassVar

import numpy as np

from chain.data.catalog import DataInfo
from chain.fields import boolean, choice, integer, mapping, number, optional, setting, string

MAX_BATCH = 2**31 - 1  # TensorFlow indexes a batch with int32
MAX_CLASSES = 1 << 20


@dataclass(frozen=True, kw_only=True)
class DataSet:
    """What every data set has: its name, the batch size, whether batches are shuffled, and the
    share of its examples held out for validation (`val_fraction`; None: the data set's own
    validation split, or 0.1 of its examples when it has none; 0: no validation)."""

    name: str = setting(string, "the data source (or, data=keras, the Keras data set)")
    batch_size: int = setting(
        integer(1, MAX_BATCH), "examples per batch (mirrored: the global batch; a step uses trainer.grad_accum batches)"
    )
    shuffle: bool = setting(boolean, "shuffle the training examples (a seeded shuffle, restored on resume)")
    val_fraction: float | None = setting(
        optional(number(minimum=0.0, below=1.0)),
        "share held out for validation; null: the data's own validation split, else 0.1; 0: none",
    )
    OWN_SPLIT: ClassVar[str | None] = None  # what names the validation split the data set brings itself

    @property
    def lengths_vary(self) -> bool:
        """Whether its examples come in different lengths (batches padded per length bucket)."""
        return False

    @property
    def packed(self) -> bool:
        """Whether its windows are packed with several examples (`{"token_ids", "segment_ids"}` inputs)."""
        return False


@dataclass(frozen=True, kw_only=True)
class StreamSettings:
    """The keys of a source that can be read while training (`data.stream=true`), declared once: a
    source's settings class lists it (or `BadRecords`) first among its bases, so that they follow
    the keys every data set has."""

    stream: bool = setting(
        boolean,
        "read the data while training instead of loading it (data larger than memory); needs data.classes for "
        "class targets (docs/your-data.md says what each source needs)",
    )
    shuffle_buffer: int = setting(
        integer(1, MAX_CLASSES),
        "data.stream=true: examples in the shuffle buffer (host memory, and the size of every checkpoint)",
    )


@dataclass(frozen=True, kw_only=True)
class BadRecords(StreamSettings):
    """The stream keys of a source whose records can be bad (`data.on_bad_record`)."""

    on_bad_record: str = setting(
        choice("fail", "skip"),
        "data.stream=true: a record (or CSV row) unlike the data's declaration stops the run naming its file "
        "(fail) or is left out (skip)",
    )


@dataclass(frozen=True, kw_only=True)
class Labelled(DataSet):
    """The user's data: inputs and targets. `y` names one target array (the target is then
    called `label` for integers, `value` for reals); `targets` names several (target name ->
    array). `classes` sets a target's kind (target name -> number of classes, 0 for a real
    value); by default integer labels are classes (their maximum + 1), reals are values."""

    y: str | None = setting(optional(string), "one target (called `label` for integers, `value` for reals)")
    targets: tuple[tuple[str, str], ...] | None = setting(
        optional(mapping(string)), "several targets: {name: key or column} (instead of y)"
    )
    classes: tuple[tuple[str, int], ...] | None = setting(
        optional(mapping(integer(0, MAX_CLASSES))),
        "a target's kind: {name: number of classes, or 0 for a real value}; default from its values",
    )


@dataclass
class Read:
    """What a source read: inputs and targets (in the data set's target order; `names[k]` None
    for `data.y`, named by its kind), the validation examples it brings (None: held out by
    `chain.data.loader.split`), and what each array was read from (`where`, for error lines)."""

    x: np.ndarray
    ys: list[np.ndarray]
    names: list[str | None]
    where: list[str]
    val: tuple[np.ndarray, list[np.ndarray]] | None = None
    val_where: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class Source:
    """One data source: its settings class, its description, its reader and, for a source that
    can stream (`data.stream=true`), what it streams (see the module)."""

    settings: type
    describe: Callable[[Any], DataInfo | None]
    read: Callable[[Any, int, DataInfo | None], Read]
    shards: Callable[[Any], Any] | None = None

    @property
    def kinds(self) -> tuple[str, ...]:
        """The `data.name`s that pick this source."""
        return getattr(self.settings, "KINDS", None) or (self.settings.KIND,)


def from_files(data, read: Callable[[str, str], tuple], key: str, val_key: str, names: list[str | None]) -> Read:
    """A source of files: `read(path, path_key) -> (x, targets, where)` reads `data.<key>` and, when
    given, the validation examples of `data.<val_key>`; `names` are the targets' names."""
    x, ys, where = read(getattr(data, key), f"data.{key}")
    if getattr(data, val_key) is None:
        return Read(x, ys, names, where)
    vx, vys, val_where = read(getattr(data, val_key), f"data.{val_key}")
    return Read(x, ys, names, where, (vx, vys), [f"{w} of data.{val_key}" for w in val_where])
