"""What a CSV stream reads (`data=csv data.stream=true`): `CsvFiles`, made by `csv_data.shards`
without TensorFlow and read by `csv_stream`."""

from __future__ import annotations

from dataclasses import dataclass

from chain.data.streamed import FileCounts


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
    val_key: str = FileCounts.TRAIN_KEY
