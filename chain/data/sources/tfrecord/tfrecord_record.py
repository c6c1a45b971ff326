"""What a TFRecord stream reads (`data=tfrecord data.stream=true`): `Shards`, which files, how their
records parse and how many records each holds (`count`, from the files' framing or the count cache).
No TensorFlow: `tfrecord_data.shards` makes it in the preparation pass and `tfrecord_stream` reads it.
"""

from __future__ import annotations

from dataclasses import dataclass

from chain.data import count_cache
from chain.data.sources.tfrecord import tfrecord_files
from chain.data.streamed import FileCounts


@dataclass(frozen=True)
class IdRange:
    """`model=gpt`'s ids, checked as the stream reads them: the input's within `[0, vocab)`, and the
    labels of feature `target` too, but for `ignored` (`ignore_class`, None: none)."""

    vocab: int
    target: str
    ignored: int | None = None


@dataclass(frozen=True)
class Shards(FileCounts):
    """Files streamed in a run: training `paths` and validation `val_paths` (empty: none), each
    file's record count (`counts`, `val_counts`), the features to parse (`features`: name ->
    (dtype, shape), as `data.features`), the input feature `x`, the targets as (name, feature,
    classes), the shuffle buffer in examples and whether bad records are left out (`skip_bad`,
    `data.on_bad_record=skip`) or stop the run; `val_key` is the key that names the validation
    files (`data.val_path`, or `data.path` when they are held out of it); `buckets`: an `int64[None]`
    input's length buckets (`tfrecord_varlen`); `ids`: token ids checked while streamed (`IdRange`)."""

    features: tuple[tuple[str, tuple], ...]
    x: str
    targets: tuple[tuple[str, str, int], ...]
    shuffle_buffer: int
    skip_bad: bool = False
    val_key: str = FileCounts.TRAIN_KEY
    buckets: tuple[int, ...] | None = None  # an int64[None] input's length buckets (None: fixed lengths)
    ids: IdRange | None = None  # model=gpt: the ids within its vocabulary (None: not checked)


def count(paths: list[str], key: str) -> tuple[int, ...]:
    """The records of each file (`key` names the glob, for error lines), counted from the files'
    framing (a pass, logged), or read from the count cache (`chain.data.count_cache`)."""
    return count_cache.counts(paths, key, "tfrecord records", lambda p: tfrecord_files.whole_records(p, key))
