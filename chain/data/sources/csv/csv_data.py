"""`data=csv`: the user's CSV file with a header row (and an optional second one for validation):
its settings, description and reader. The table is parsed once per version of the file
(`csv_table.csv_table`), for the description and the reader alike.

With `data.stream=true` the rows are never loaded: `data.path` may be a glob of files with one
header, the description comes from the header (the input columns), `data.classes` (every target's
kind) and a count of the rows (cached, `chain.data.count_cache`), and `shards` says what
`csv_stream` reads."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from chain.data import count_cache
from chain.data.sources.csv import csv_table
from chain.data.catalog import (
    DataInfo,
    Target,
    name_targets,
    no_other_classes,
    split_info,
    stream_classes,
    target_keys,
)
from chain.data.data_source import BadRecords, Labelled, Read, Source, from_files
from chain.data.sources.csv.csv_record import CsvFiles
from chain.data.streamed import Streamed, none_empty, refuse_share, stream_files
from chain.errors import ConfigError
from chain.fields import list_of, optional, required, setting, string


@dataclass(frozen=True, kw_only=True)
class Csv(BadRecords, Labelled):
    """A CSV file with a header row: targets are columns by name, the inputs the columns `x`
    (None: every column that is not a target); `val_path` an optional second file."""

    KIND: ClassVar[str] = "csv"
    path: str = setting(
        required(string, "data=csv data.path=FILE.csv data.y=COLUMN"),
        "the .csv file with a header row (required); data.stream=true: a glob of such files",
    )
    val_path: str | None = setting(
        optional(string), "a second CSV file with the same columns, for validation (data.stream=true: a glob)"
    )
    x: tuple[str, ...] | None = setting(
        optional(list_of(string, 1)), "the input columns; null: every column that is not a target"
    )


class CsvStream(CsvFiles, Streamed):
    """CSV files streamed, opening their stream (`csv_stream`)."""

    def training(self, batch, shuffle, seed, skipped=None, share=None):
        from chain.data.sources.csv import csv_stream

        refuse_share(share)
        return csv_stream.training(self, batch, shuffle, seed, skipped)

    def validation(self, batch, skipped=None):
        from chain.data.sources.csv import csv_stream

        return csv_stream.validation(self, batch, skipped)

    def skip_counter(self):
        from chain.data.sources.csv import csv_stream

        return csv_stream.skip_counter(self)

    def bad_record(self, error):
        from chain.data.sources.csv import csv_stream

        return csv_stream.bad_record(error, self)


def csv_columns(data: Csv, table: csv_table.Table) -> list[str]:
    """The input columns of a CSV source: `data.x`, or every column that is not a target."""
    used = {key for _, key, _ in target_keys(data)}
    if data.x is None:
        columns = [c for c in table.columns if c not in used]
        if not columns:
            raise ConfigError(
                f"data.path={table.path!r} has no column left for the inputs once the targets "
                f"({', '.join(sorted(used))}) are taken"
            )
        return columns
    for i, c in enumerate(data.x):
        table.column(c, f"data.x[{i}]")
        if c in used:
            raise ConfigError(f"data.x[{i}]={c!r} is also a target; a column is an input or a target")
    return list(data.x)


def describe(data: Csv) -> DataInfo:
    """The number of input columns; the targets' kinds from their values (whole numbers: classes),
    or, streamed, from `data.classes` and the rows counted."""
    if data.stream:
        s = shards(data)
        return DataInfo(
            "csv", (len(s.x),), s.examples, tuple(Target(name, c) for name, _, c in s.targets), s.val_examples
        )
    table = csv_table.csv_table(data.path, "data.path")
    columns = csv_columns(data, table)
    tables = [table] + ([csv_table.csv_table(data.val_path, "data.val_path")] if data.val_path else [])
    for t in tables[1:]:
        for c in columns:
            t.column(c, f"data.x column (data.val_path={data.val_path!r})")
    labels = [
        (name, np.concatenate([t.column(key, where) for t in tables]), f"{where}={key!r} of {table.path}")
        for name, key, where in target_keys(data)
    ]
    return split_info(
        "csv",
        (len(columns),),
        len(table.values),
        name_targets(data, labels, by_values=True),
        data,
        own=sum(len(t.values) for t in tables[1:]),
    )


def read(data: Csv, seed: int, info: DataInfo | None = None) -> Read:
    """The input columns as float32 and the target columns, of `data.path` (and `data.val_path`)."""

    def one(path: str, path_key: str) -> tuple[np.ndarray, list[np.ndarray], list[str]]:
        table = csv_table.csv_table(path, path_key)
        x = np.stack([table.column(c, "data.x") for c in csv_columns(data, table)], 1).astype(np.float32)
        keys = target_keys(data)
        where = [f"the input columns of {path}"] + [f"{w}={k!r}" for _, k, w in keys]
        return x, [table.column(k, w) for _, k, w in keys], where

    return from_files(data, one, "path", "val_path", [name for name, _, _ in target_keys(data)])


def _stream_targets(data: Csv, columns: tuple[str, ...], path: str) -> tuple[tuple[str, int, int], ...]:
    """(name, column index, classes) of each target of a stream: every kind from `data.classes`
    (telling classes from values by the values would need a pass over every row)."""
    given = dict(data.classes or ())
    out = []
    for name, key, where in target_keys(data):
        if key not in columns:
            raise ConfigError(f"{where}={key!r} is not a column of {path}; its columns: {', '.join(columns)}")
        name = name or ("value" if "value" in given and "label" not in given else "label")
        classes = stream_classes(
            given,
            name,
            f"whether {where}={key!r} holds class labels or values is known only after reading every row",
            needed=True,
        )  # a column has no type: even a value's 0
        out.append((name, columns.index(key), classes))
    no_other_classes(given, "data=csv", [t[0] for t in out])
    return tuple(out)


def _rows(paths: list[str], key: str, pattern: str) -> tuple[int, ...]:
    return count_cache.counts(paths, f"{key}={pattern!r}", "csv rows", lambda p: csv_table.csv_rows(p, key))


def shards(data: Csv) -> CsvStream:
    """What a stream (`data.stream=true`) reads: the files of the glob `data.path` (one header, checked
    in every file), their rows counted, the input and target columns. Validation is `data.val_path`,
    or the last whole files of `data.path` in sorted order (`data.val_fraction` of the files)."""
    paths, val, val_key = stream_files(data)
    columns = csv_table.csv_header(paths[0], "data.path")
    x = csv_columns(data, csv_table.Table(paths[0], columns, np.empty((0, len(columns)))))
    targets = _stream_targets(data, columns, paths[0])
    for path in paths + val:
        key = val_key if path in val else "data.path"
        if csv_table.csv_header(path, key) != columns:
            raise ConfigError(
                f"{key}: the header of {path} is not the header of {paths[0]} "
                f"({', '.join(columns)}); every file streamed has the same columns"
            )
    counts = _rows(paths, "data.path", data.path)
    none_empty(paths, counts, "data.path", "rows")
    val_counts = _rows(val, val_key, data.val_path or data.path) if val else ()
    none_empty(val, val_counts, val_key, "rows", held=data.val_path is None)
    return CsvStream(
        tuple(paths),
        counts,
        tuple(val),
        val_counts,
        columns,
        tuple(columns.index(c) for c in x),
        targets,
        data.shuffle_buffer,
        data.on_bad_record == "skip",
        val_key,
    )


SOURCE = Source(Csv, describe, read, shards)
