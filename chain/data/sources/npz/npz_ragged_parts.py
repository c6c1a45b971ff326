"""`data=npz data.offsets=KEY`: examples of different lengths in one `.npz` file, as a flat array of ids
(`data.x`) and an (N + 1,) array of offsets (`data.offsets`): example i is `ids[offsets[i]:offsets[i+1]]`,
the form of `tf.RaggedTensor.from_row_splits` and of NumPy's own concatenation, which any writer can make
(`np.cumsum` of the lengths) and which is read in place: one example is a slice of the memory-mapped ids,
nothing per example is stored twice. An array of objects (lists) would need pickle, and a padded (N, L)
array would store the padding this form avoids. Labels: one per example (N,) or one per id (as the ids,
cut by the same offsets).

Streamed only (`data.stream=true`), in length buckets (`data.buckets`) as an `int64[None]` TFRecord input
is (`npz_ragged`); a damaged file (offsets not increasing, not from 0 to the ids' length, labels of
another length) is one line naming the file and the array. No TensorFlow here.
"""

from __future__ import annotations

import numpy as np

from chain.data.catalog import DataInfo, Target, held_out, increasing_buckets, no_other_classes, stream_classes
from chain.data.catalog import target_keys
from chain.data.sources.npz import npz_members
from chain.data.sources.npz.npz_record import RaggedFiles, RaggedPart
from chain.data.streamed import Streamed, refuse_share
from chain.errors import ConfigError


class RaggedStream(RaggedFiles, Streamed):
    """An `.npz` file's ragged ids streamed in length buckets, opening their stream (`npz_ragged`)."""

    def training(self, batch, shuffle, seed, skipped=None, share=None):
        from chain.data.sources.npz import npz_ragged

        refuse_share(share)
        return npz_ragged.training(self, batch, shuffle, seed)

    def validation(self, batch, skipped=None):
        from chain.data.sources.npz import npz_ragged

        return npz_ragged.validation(self, batch)


def check_settings(data) -> None:
    """`data.offsets` and `data.buckets` together, before any file is read: one line naming the key."""
    if data.offsets is None:
        if data.buckets is not None:
            raise ConfigError(
                "data.buckets needs examples of different lengths: give data.offsets=KEY (an (N+1,) array of "
                "where each example starts in the flat ids of data.x)"
            )
        return
    if not data.stream or data.buckets is None:
        raise ConfigError(
            f"data.offsets={data.offsets!r} makes examples of different lengths: it needs data.stream=true and "
            "data.buckets=[...] (increasing lengths, e.g. [64,128,256])"
        )
    increasing_buckets(data.buckets)


def _offsets(path: str, data, path_key: str, ids: int) -> int:
    """The examples of `path` once its offsets are checked: integers, from 0, increasing (each example at
    least one id), the last the ids' length `ids`; one line naming the file and the array otherwise."""
    where = f"data.offsets={data.offsets!r} of {path}"
    offsets = npz_members.npz_array(path, data.offsets, "data.offsets", path_key)
    if offsets.ndim != 1 or offsets.dtype.kind not in "iu" or len(offsets) < 2:
        raise ConfigError(
            f"{where} holds {offsets.dtype} of shape {offsets.shape}; give an (N+1,) integer array: 0, then where "
            "each example ends in the ids"
        )
    steps = np.diff(offsets.astype(np.int64))
    if offsets[0] != 0 or (steps <= 0).any():
        at = 0 if offsets[0] != 0 else int(np.flatnonzero(steps <= 0)[0]) + 1
        raise ConfigError(
            f"{where} is not increasing from 0 (offsets[{at}] is {int(offsets[at])}); each example holds one id "
            "or more: offsets = np.concatenate([[0], np.cumsum(lengths)])"
        )
    if offsets[-1] != ids:
        raise ConfigError(
            f"{where} ends at {int(offsets[-1])}, but data.x={data.x!r} holds {ids} ids; the last offset is "
            "the ids' length"
        )
    return len(offsets) - 1


def _part(data, path: str, path_key: str) -> tuple[RaggedPart, tuple[tuple[str, int], ...], tuple[bool, ...]]:
    """Every example of `path` read in place, the targets' (name, classes) and whether each is per id."""
    x = npz_members.npz_member(path, data.x, "data.x", path_key)
    if len(x.shape) != 1 or np.dtype(x.dtype).kind not in "iu":
        raise ConfigError(
            f"data.x={data.x!r} of {path} holds {np.dtype(x.dtype)} of shape {x.shape}; with data.offsets it is "
            "the flat integer ids of every example, one after the other"
        )
    n = _offsets(path, data, path_key, x.shape[0])
    given, ys, targets, per_id = dict(data.classes or ()), [], [], []
    for name, key, where in target_keys(data):
        y = npz_members.npz_member(path, key, where, path_key)
        integral = np.dtype(y.dtype).kind in "iub"
        by_id = y.shape == x.shape and n != x.shape[0]
        if not by_id and y.shape not in ((n,), (n, 1)) or (by_id and not integral):
            raise ConfigError(
                f"{where}={key!r} of {path} has shape {y.shape}; with data.offsets a target holds one value per "
                f"example ({n},), or one class label per id ({x.shape[0]},), cut by the same offsets"
            )
        name = name or ("label" if integral else "value")
        known = f"the number of classes of {where}={key!r} is known only after reading every label"
        targets.append((name, stream_classes(given, name, known, needed=integral)))
        ys.append(y)
        per_id.append(by_id)
    no_other_classes(given, "data=npz", [t[0] for t in targets])
    offsets = npz_members.npz_member(path, data.offsets, "data.offsets", path_key)
    return RaggedPart(x, tuple(ys), 0, n, offsets), tuple(targets), tuple(per_id)


def shards(data) -> RaggedStream:
    """What the stream reads: the examples of `data.path` and of `data.val_path`, or the last
    `data.val_fraction` of `data.path`'s examples (the same on every run) for validation."""
    check_settings(data)
    train, targets, per_id = _part(data, data.path, "data.path")
    if data.val_path is not None:
        val, val_targets, val_per_id = _part(data, data.val_path, "data.val_path")
        if (val_targets, val_per_id) != (targets, per_id):
            raise ConfigError(
                f"data.val_path={data.val_path!r}: its targets are not as those of data.path={data.path!r} "
                "(one label per example or per id, and the same classes)"
            )
    else:
        held = held_out(train.rows, data, f"data.path={data.path!r}")
        val = RaggedPart(train.x, train.ys, train.stop - held, train.stop, train.offsets)
        train = RaggedPart(train.x, train.ys, 0, train.stop - held, train.offsets)
    return RaggedStream(train, val if val.rows else None, targets, per_id, tuple(data.buckets), data.shuffle_buffer)


def describe(data) -> DataInfo:
    """Examples of up to the largest bucket's ids (what the memory estimate and plan=auto size), padded
    with 0; a label per id is padded with 0 too."""
    s = shards(data)
    longest = s.buckets[-1]
    return DataInfo(
        "npz",
        (longest,),
        s.examples,
        tuple(
            Target(name, classes, (longest,) if by_id else ()) for (name, classes), by_id in zip(s.targets, s.per_id)
        ),
        s.val_examples,
        lengths_vary=True,
        padded=True,
    )
