"""`data=csv`: the user's CSV file with a header row (and an optional second one for validation):
its settings, description and reader. The table is parsed once per version of the file
(`chain.data.files.csv_table`), for the description and the reader alike."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from chain.data import files
from chain.data.catalog import DataInfo, name_targets, split_info, target_keys
from chain.data.data_source import Labelled, Read, Source, from_files
from chain.errors import ConfigError
from chain.fields import list_of, optional, required, setting, string


@dataclass(frozen=True, kw_only=True)
class Csv(Labelled):
    """A CSV file with a header row: targets are columns by name, the inputs the columns `x`
    (None: every column that is not a target); `val_path` an optional second file."""

    KIND: ClassVar[str] = "csv"
    path: str = setting(required(string, "data=csv data.path=FILE.csv data.y=COLUMN"),
        "the .csv file with a header row (required)")
    val_path: str | None = setting(optional(string), "a second CSV file with the same columns, for validation")
    x: tuple[str, ...] | None = setting(optional(list_of(string, 1)),
        "the input columns; null: every column that is not a target")


def csv_columns(data: Csv, table: files.Table) -> list[str]:
    """The input columns of a CSV source: `data.x`, or every column that is not a target."""
    used = {key for _, key, _ in target_keys(data)}
    if data.x is None:
        columns = [c for c in table.columns if c not in used]
        if not columns:
            raise ConfigError(f"data.path={table.path!r} has no column left for the inputs once the targets "
                              f"({', '.join(sorted(used))}) are taken")
        return columns
    for i, c in enumerate(data.x):
        table.column(c, f"data.x[{i}]")
        if c in used:
            raise ConfigError(f"data.x[{i}]={c!r} is also a target; a column is an input or a target")
    return list(data.x)


def describe(data: Csv) -> DataInfo:
    """The number of input columns; the targets' kinds from their values (whole numbers: classes)."""
    table = files.csv_table(data.path, "data.path")
    columns = csv_columns(data, table)
    tables = [table] + ([files.csv_table(data.val_path, "data.val_path")] if data.val_path else [])
    for t in tables[1:]:
        for c in columns:
            t.column(c, f"data.x column (data.val_path={data.val_path!r})")
    labels = [(name, np.concatenate([t.column(key, where) for t in tables]), f"{where}={key!r} of {table.path}")
              for name, key, where in target_keys(data)]
    return split_info("csv", (len(columns),), len(table.values), name_targets(data, labels, by_values=True), data,
                      own=sum(len(t.values) for t in tables[1:]))


def read(data: Csv, seed: int, info: DataInfo | None = None) -> Read:
    """The input columns as float32 and the target columns, of `data.path` (and `data.val_path`)."""
    def one(path: str, path_key: str) -> tuple[np.ndarray, list[np.ndarray], list[str]]:
        table = files.csv_table(path, path_key)
        x = np.stack([table.column(c, "data.x") for c in csv_columns(data, table)], 1).astype(np.float32)
        keys = target_keys(data)
        where = [f"the input columns of {path}"] + [f"{w}={k!r}" for _, k, w in keys]
        return x, [table.column(k, w) for _, k, w in keys], where

    return from_files(data, one, "path", "val_path", [name for name, _, _ in target_keys(data)])


SOURCE = Source(Csv, describe, read)
