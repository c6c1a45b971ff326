"""A CSV file read with Python's `csv` and NumPy alone (no TensorFlow): `csv_table`, a file with a
header row as column names and a float64 matrix (read once per version of the file: the config
checks and the build both read it); `csv_header`, `csv_rows`: a file's header and its number of
rows without reading it into memory (for streaming it). A file not in UTF-8, a header with a blank
or repeated column name, a cell that is not a finite number: one `ConfigError` line naming the key
and the file."""

from __future__ import annotations

import codecs
import csv
import functools
import io
import math
from dataclasses import dataclass

import numpy as np

from chain.data.paths import existing, version
from chain.errors import ConfigError


@dataclass(frozen=True)
class Table:
    """A CSV file: its header and its cells as float64, one row per example."""

    path: str
    columns: tuple[str, ...]
    values: np.ndarray

    def column(self, name: str, key: str) -> np.ndarray:
        if name not in self.columns:
            raise ConfigError(f"{key}={name!r} is not a column of {self.path}; its columns: {', '.join(self.columns)}")
        return self.values[:, self.columns.index(name)]


def csv_table(path: str, key: str) -> Table:
    """The CSV file `path` (a header row, then numbers), read once per version of the file."""
    return _csv_table(*version(existing(path, key)), key)


def _text(path: str, key: str) -> str:
    """The file as UTF-8 text, without the byte order mark some editors write first (read as
    part of the first column's name, it would look like the name and not match it)."""
    with open(path, "rb") as f:
        raw = f.read()
    if raw.startswith(codecs.BOM_UTF8):
        raw = raw[len(codecs.BOM_UTF8) :]
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        line, line_start = raw.count(b"\n", 0, e.start) + 1, raw.rfind(b"\n", 0, e.start) + 1
        raise ConfigError(
            f"{key}={path!r} is not UTF-8 text: line {line} holds the byte "
            f"0x{raw[e.start]:02x} at column {e.start - line_start + 1}; save it as UTF-8"
        ) from None


def _header(names: list[str], path: str, key: str) -> list[str]:
    """The column names, each given and given once (a repeated name would read one column twice)."""
    names = [h.strip() for h in names]
    for i, name in enumerate(names):
        if not name:
            raise ConfigError(
                f"{key}={path!r}: column {i + 1} of the header has no name; give every column its own name"
            )
        if name in names[:i]:
            raise ConfigError(
                f"{key}={path!r}: columns {names.index(name) + 1} and {i + 1} of the header are both "
                f"called {name!r}; give every column its own name"
            )
    return names


@functools.lru_cache(maxsize=4)
def _csv_table(path: str, mtime: int, size: int, key: str) -> Table:
    reader = csv.reader(io.StringIO(_text(path, key), newline=""))
    header = next(reader, None)
    if not header:
        raise ConfigError(f"{key}={path!r} is empty; a CSV file needs a header row naming its columns")
    header = _header(header, path, key)
    rows = []
    for row in reader:
        if not row:
            continue
        line = reader.line_num
        if len(row) != len(header):
            raise ConfigError(f"{key}={path!r}: line {line} has {len(row)} fields, the header has {len(header)}")
        try:
            values = [float(v) for v in row]
        except ValueError:
            values = None
        if values is None or not all(math.isfinite(v) for v in values):
            col = next(i for i, v in enumerate(row) if not _is_finite(v))
            what = "a finite number" if _is_number(row[col]) else "a number"
            raise ConfigError(f"{key}={path!r}: line {line}, column {header[col]!r} holds {row[col]!r}, not {what}")
        rows.append(values)
    if not rows:
        raise ConfigError(f"{key}={path!r} has a header but no rows")
    return Table(path, tuple(header), np.array(rows, dtype=np.float64))


def csv_header(path: str, key: str) -> tuple[str, ...]:
    """The column names of the CSV file `path` (its first line), without reading the rest."""
    with open(existing(path, key), "rb") as f:
        first = f.readline()
    if first.startswith(codecs.BOM_UTF8):
        first = first[len(codecs.BOM_UTF8) :]
    try:
        text = first.decode("utf-8")
    except UnicodeDecodeError:
        raise ConfigError(f"{key}={path!r}: its header (line 1) is not UTF-8 text; save it as UTF-8") from None
    header = next(csv.reader([text.rstrip("\r\n")]), None)
    if not header:
        raise ConfigError(f"{key}={path!r} is empty; a CSV file needs a header row naming its columns")
    return tuple(_header(header, path, key))


def csv_rows(path: str, key: str) -> int:
    """The rows of the CSV file `path`: its lines that are not blank, the header's left out (a pass
    over the file, line by line)."""
    n = 0
    with open(existing(path, key), "rb") as f:
        for line in f:
            n += bool(line.strip())
    return max(0, n - 1)


def _is_number(v: str) -> bool:
    try:
        float(v)
    except ValueError:
        return False
    return True


def _is_finite(v: str) -> bool:
    return _is_number(v) and math.isfinite(float(v))
