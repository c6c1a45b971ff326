"""`data=npz`: the user's NumPy `.npz` file (and an optional second one for validation): its
settings, description and reader.

The description reads the input array's header (its shape) and the target arrays (their kinds:
classes or values); the reader then reads the inputs and takes the targets the description read
(`_targets`, kept per version of the file), so each array of the file is read once per run.
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from chain.data import files
from chain.data.catalog import DataInfo, input_shape, name_targets, split_info, target_keys
from chain.data.data_source import Labelled, Read, Source, from_files
from chain.fields import optional, required, setting, string


@dataclass(frozen=True, kw_only=True)
class Npz(Labelled):
    """A NumPy `.npz` file: `x` and the targets are keys of its arrays; `val_path` an optional
    second file with the same keys, for validation."""

    KIND: ClassVar[str] = "npz"
    path: str = setting(required(string, "data=npz data.path=FILE.npz data.x=KEY data.y=KEY"),
        "the .npz file (required)")
    val_path: str | None = setting(optional(string), "a second .npz file with the same keys, for validation")
    x: str = setting(string, "the key of the inputs: one example per row")


def _targets(data: Npz, path: str, path_key: str) -> list[np.ndarray]:
    """The target arrays of `path`, in `target_keys` order: read once per version of the file."""
    keys = tuple((key, where) for _, key, where in target_keys(data))
    files.existing(path, path_key)
    st = os.stat(path)
    return list(_read_targets(path, st.st_mtime_ns, st.st_size, keys, path_key))


@functools.lru_cache(maxsize=4)
def _read_targets(path: str, mtime: int, size: int, keys: tuple, path_key: str) -> tuple[np.ndarray, ...]:
    return tuple(files.npz_array(path, key, where, path_key) for key, where in keys)


def describe(data: Npz) -> DataInfo:
    """The inputs' shape from the header of `data.x`, the targets' kinds from their values."""
    counts, shape = [], ()
    labels: dict[str, list] = {}
    for path, path_key in ((data.path, "data.path"), (data.val_path, "data.val_path")):
        if path is None:
            continue
        x_shape = files.npz_shape(path, data.x, "data.x", path_key)
        counts.append(x_shape[0])
        shape = shape or input_shape(x_shape, f"data.x={data.x!r} in {path}")
        for (name, key, where), y in zip(target_keys(data), _targets(data, path, path_key)):
            labels.setdefault(where, [name, f"{where}={key!r} of {path}"]).append(y.reshape(-1))
    targets = name_targets(data, [(v[0], np.concatenate(v[2:]), v[1]) for v in labels.values()])
    return split_info("npz", shape, counts[0], targets, data, own=sum(counts[1:]))


def read(data: Npz, seed: int, info: DataInfo | None = None) -> Read:
    """The inputs of `data.path` (and `data.val_path`), with the targets the description read."""
    def one(path: str, path_key: str) -> tuple[np.ndarray, list[np.ndarray], list[str]]:
        ys = _targets(data, path, path_key)
        x = files.npz_array(path, data.x, "data.x", path_key)
        return x, ys, [f"data.x={data.x!r} of {path}"] + [f"{w}={k!r}" for _, k, w in target_keys(data)]

    return from_files(data, one, "path", "val_path", [name for name, _, _ in target_keys(data)])


SOURCE = Source(Npz, describe, read)
