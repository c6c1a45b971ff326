"""`data=npz`: the user's NumPy `.npz` file (and an optional second one for validation): its
settings, description and reader.

The description reads the input array's header (its shape) and the target arrays (their kinds:
classes or values); the reader then reads the inputs and takes the targets the description read
(`_targets`, kept per version of the file), so each array of the file is read once per run.

With `data.stream=true` no array is loaded: the description comes from the arrays' headers (the
input's shape, the number of examples) and `data.classes` (each integer target's number of classes),
and `shards` says where in the file each array's data lies, for `npz_stream`.
"""

from __future__ import annotations

import functools
import math
import os
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from chain.data.paths import existing
from chain.data.sources.npz import npz_members, npz_ragged_parts
from chain.data.catalog import DataInfo, Target, held_out, input_shape, name_targets, split_info, target_keys
from chain.data.catalog import label_shape, no_other_classes, stream_classes
from chain.data.data_source import Labelled, Read, Source, StreamSettings, from_files
from chain.data.sources.npz.npz_record import ArrayFiles, ArrayPart
from chain.data.streamed import Streamed, refuse_share
from chain.data.verify import in_vocab
from chain.errors import ConfigError
from chain.fields import integer, list_of, optional, required, setting, string

BLOCKS = 256  # a stream's training rows are cut into about this many blocks (what is shuffled per epoch)
# Bytes of inputs, at least, in a block: a block costs about 1.5 ms of CPU to start reading
# (its datasets made and its file opened, measured), a few percent of the stream's work at 1 MB.
MIN_BLOCK_BYTES = 1 << 20


@dataclass(frozen=True, kw_only=True)
class Npz(StreamSettings, Labelled):
    """A NumPy `.npz` file: `x` and the targets are keys of its arrays; `val_path` an optional
    second file with the same keys, for validation."""

    KIND: ClassVar[str] = "npz"
    path: str = setting(
        required(string, "data=npz data.path=FILE.npz data.x=KEY data.y=KEY"), "the .npz file (required)"
    )
    val_path: str | None = setting(optional(string), "a second .npz file with the same keys, for validation")
    x: str = setting(string, "the key of the inputs: one example per row (with data.offsets: the flat ids)")
    offsets: str | None = setting(
        optional(string),
        "examples of different lengths (data.stream=true, data.buckets): the key of an (N+1,) array, example i "
        "the ids data.x[offsets[i]:offsets[i+1]]; labels (N,) per example or one per id",
    )
    buckets: tuple[int, ...] | None = setting(
        optional(list_of(integer(1, 1 << 20), 1)),
        "data.offsets: increasing lengths, each batch padded with 0 to the first its examples fit; longer "
        "examples cut to the last",
    )

    @property
    def lengths_vary(self) -> bool:
        """Ragged ids (`data.offsets`), in length buckets."""
        return self.offsets is not None


class NpzStream(ArrayFiles, Streamed):
    """An `.npz` file's arrays streamed in place, opening their stream (`npz_stream`)."""

    def training(self, batch, shuffle, seed, skipped=None, share=None):
        from chain.data.sources.npz import npz_stream

        refuse_share(share)
        return npz_stream.training(self, batch, shuffle, seed)

    def validation(self, batch, skipped=None):
        from chain.data.sources.npz import npz_stream

        return npz_stream.validation(self, batch)

    def check_ids(self, data, vocab: int, target: str, ignored: int | None = None) -> Streamed:
        """The inputs and `target` (or `ignored`) of every part within `[0, vocab)`, read in place once."""
        learned = [name for name, _ in self.targets].index(target)
        key = [f"{where}={key!r}" for _, key, where in target_keys(data)][learned]
        members = {
            m: k
            for part in (self.train, self.val)
            if part is not None  # data.path's validation rows:
            for m, k in ((part.x, f"data.x={data.x!r}"), (part.ys[learned], key))
        }  # the same members
        for member, k in members.items():
            _in_place(member, vocab, f"{k} of {member.path}", ignored if k == key else None)
        return self


def _in_place(member: npz_members.Member, vocab: int, where: str, ignored: int | None = None) -> None:
    """`in_vocab` of a member read in place, a block of rows at a time."""
    rows = np.memmap(member.path, np.dtype(member.dtype), "r", member.offset, member.shape)
    step = max(1, (1 << 24) // max(1, math.prod(member.shape[1:])))
    for i in range(0, len(rows), step):
        in_vocab(np.asarray(rows[i : i + step]), vocab, where, ignored)


def _targets(data: Npz, path: str, path_key: str) -> list[np.ndarray]:
    """The target arrays of `path`, in `target_keys` order: read once per version of the file."""
    keys = tuple((key, where) for _, key, where in target_keys(data))
    existing(path, path_key)
    st = os.stat(path)
    return list(_read_targets(path, st.st_mtime_ns, st.st_size, keys, path_key))


@functools.lru_cache(maxsize=4)
def _read_targets(path: str, mtime: int, size: int, keys: tuple, path_key: str) -> tuple[np.ndarray, ...]:
    return tuple(npz_members.npz_array(path, key, where, path_key) for key, where in keys)


def describe(data: Npz) -> DataInfo:
    """The inputs' shape from the header of `data.x`, the targets' kinds from their values (streamed:
    from their dtypes and `data.classes`, read from the headers alone; ragged ids: `npz_ragged_parts`)."""
    npz_ragged_parts.check_settings(data)
    if data.lengths_vary:
        return npz_ragged_parts.describe(data)
    if data.stream:
        s = shards(data)
        return DataInfo(
            "npz",
            s.train.x.shape[1:],
            s.examples,
            tuple(Target(n, c, label_shape(y.shape[1:])) for (n, c), y in zip(s.targets, s.train.ys)),
            s.val_examples,
        )
    counts, shape = [], ()
    labels: dict[str, list] = {}
    for path, path_key in ((data.path, "data.path"), (data.val_path, "data.val_path")):
        if path is None:
            continue
        x_shape = npz_members.npz_shape(path, data.x, "data.x", path_key)
        counts.append(x_shape[0])
        shape = shape or input_shape(x_shape, f"data.x={data.x!r} in {path}")
        for (name, key, where), y in zip(target_keys(data), _targets(data, path, path_key)):
            # A label per position ((N, seq)) keeps its shape: the target's (`name_targets`).
            labels.setdefault(where, [name, f"{where}={key!r} of {path}"]).append(
                y.reshape(len(y), *y.shape[1:]) if y.ndim > 1 and y.shape[1:] != (1,) else y.reshape(-1)
            )
    targets = name_targets(data, [(v[0], _together(v[2:], v[1]), v[1]) for v in labels.values()])
    return split_info("npz", shape, counts[0], targets, data, own=sum(counts[1:]))


def _together(arrays: list[np.ndarray], where: str) -> np.ndarray:
    """A target's arrays of the training and the validation file as one (their labels per example must agree)."""
    if len({a.shape[1:] for a in arrays}) > 1:
        raise ConfigError(
            f"{where} has labels of shape {arrays[0].shape[1:]} per example in data.path but "
            f"{arrays[1].shape[1:]} in data.val_path; both files must agree"
        )
    return np.concatenate(arrays)


def read(data: Npz, seed: int, info: DataInfo | None = None) -> Read:
    """The inputs of `data.path` (and `data.val_path`), with the targets the description read."""

    def one(path: str, path_key: str) -> tuple[np.ndarray, list[np.ndarray], list[str]]:
        ys = _targets(data, path, path_key)
        x = npz_members.npz_array(path, data.x, "data.x", path_key)
        return x, ys, [f"data.x={data.x!r} of {path}"] + [f"{w}={k!r}" for _, k, w in target_keys(data)]

    return from_files(data, one, "path", "val_path", [name for name, _, _ in target_keys(data)])


def _part(data: Npz, path: str, path_key: str) -> tuple[ArrayPart, tuple[tuple[str, int], ...]]:
    """Every row of the arrays of `path` as read in place, and the targets' (name, classes): integer
    targets are classes, whose number `data.classes` must give (finding it needs every label)."""
    x = npz_members.npz_member(path, data.x, "data.x", path_key)
    input_shape(x.shape, f"data.x={data.x!r} in {path}")
    given, ys, targets = dict(data.classes or ()), [], []
    for name, key, where in target_keys(data):
        y = npz_members.npz_member(path, key, where, path_key)
        integral = np.dtype(y.dtype).kind in "iub"
        labels = label_shape(y.shape[1:])
        if y.shape[:1] != x.shape[:1] or len(labels) > 1 or (labels and not integral):
            raise ConfigError(
                f"{where}={key!r} of {path} has shape {y.shape}; a target holds one value per example "
                f"of data.x ({x.shape[0]},), or one class label per position ((N, seq): integers)"
            )
        name = name or ("label" if integral else "value")
        classes = stream_classes(
            given,
            name,
            f"the number of classes of {where}={key!r} is known only after reading every label",
            needed=integral,
        )
        ys.append(y)
        targets.append((name, classes))
    no_other_classes(given, "data=npz", [t[0] for t in targets])
    return ArrayPart(x, tuple(ys), 0, x.shape[0]), tuple(targets)


def shards(data: Npz) -> NpzStream | npz_ragged_parts.RaggedStream:
    """What a stream (`data.stream=true`) reads: where each array lies in `data.path` (and
    `data.val_path`). Validation without `data.val_path` is the last `data.val_fraction` of the rows:
    the same rows on every run (shuffle the arrays before saving them if their order is sorted)."""
    if data.lengths_vary:
        return npz_ragged_parts.shards(data)
    train, targets = _part(data, data.path, "data.path")
    if not train.rows:
        raise ConfigError(f"data.path={data.path!r}: its arrays hold no rows ({data.x}: {train.x.shape})")
    if data.val_path is not None:
        val, val_targets = _part(data, data.val_path, "data.val_path")
        if not val.rows:
            raise ConfigError(
                f"data.val_path={data.val_path!r}: its arrays hold no rows ({data.x}: {val.x.shape}), "
                "so there is nothing to validate on; give a file that holds examples, or leave "
                "data.val_path out"
            )
        if val.x.shape[1:] != train.x.shape[1:] or val_targets != targets:
            raise ConfigError(
                f"data.val_path={data.val_path!r}: its arrays are not shaped as those of "
                f"data.path={data.path!r} ({data.x}: {val.x.shape[1:]} vs {train.x.shape[1:]})"
            )
    else:
        held = held_out(train.rows, data, f"data.path={data.path!r}")
        val = ArrayPart(train.x, train.ys, train.stop - held, train.stop)
        train = ArrayPart(train.x, train.ys, 0, train.stop - held)
    block = max(-(-MIN_BLOCK_BYTES // max(1, train.x.row_bytes)), -(-train.rows // BLOCKS))
    return NpzStream(train, val if val.rows else None, targets, block, data.shuffle_buffer)


SOURCE = Source(Npz, describe, read, shards)
