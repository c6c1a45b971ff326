"""The `tf.data` stream of text examples in length buckets (`text_examples.Examples`).

Its position is a counter of batches, the only state of the pipeline: batch g is batch `g mod W` of
epoch `g div W` (W whole batches an epoch), and an epoch's batches are a pure function of the seed
and the epoch (`text_examples.epoch_batches`). A batch is read with NumPy (`tf.numpy_function`) and
padded to its bucket's length, so the batches' shape is `[batch, None]` and the compiled step is
traced once per bucket. The read depends on nothing but g, so the stream is saved with
`ExternalStatePolicy.IGNORE`, as the token streams are. Packed windows (`data.pack`) are streamed the
same way (`packed_training`), as `{"token_ids", "segment_ids"}` of one shape.
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from chain.data.sources.text import text_examples
from chain.data.sources.text.text_examples import Examples, Part
from chain.errors import ConfigError


def _saveable(ds: tf.data.Dataset) -> tf.data.Dataset:
    options = tf.data.Options()
    options.experimental_external_state_policy = tf.data.experimental.ExternalStatePolicy.IGNORE
    return ds.with_options(options)


def _as_batch(x, y, batch: int | None):
    x.set_shape([batch, None])
    y.set_shape([batch, None])
    return x, {Examples.TARGET: y}


def training(s: Examples, batch: int, shuffle: bool, seed: int) -> tf.data.Dataset:
    """The endless stream of `(x, {"next": y})` batches of `batch` examples, each of one bucket."""
    lengths, buckets = s.train.lengths, s.buckets
    per_epoch = text_examples.whole_batches(lengths, buckets, batch)
    if not per_epoch:
        raise ConfigError(
            f"data.buckets={list(buckets)}: no bucket holds {batch} training examples (a whole batch); "
            "give fewer buckets or a smaller data.batch_size"
        )
    made: dict[int, np.ndarray] = {}  # the epoch being read: its batches, drawn once

    def read(g: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        epoch, i = divmod(int(g), per_epoch)
        if epoch not in made:
            made.clear()
            made[epoch] = text_examples.epoch_batches(lengths, buckets, batch, shuffle, seed, epoch)
        rows = made[epoch][i]  # all of one bucket
        return text_examples.padded(s.train, rows, buckets[int(text_examples.bucket_of(lengths[rows[:1]], buckets)[0])])

    def one(g):
        x, y = tf.numpy_function(read, [g], [tf.int32, tf.int32], stateful=False)
        return _as_batch(x, y, batch)

    ds = tf.data.Dataset.counter(dtype=tf.int64).map(one)
    return _saveable(ds.prefetch(2))


def _val_batches(part: Part, buckets: tuple[int, ...], batch: int) -> list[tuple[np.ndarray, int]]:
    """Every validation example once: per bucket, in order, batches of at most `batch`, and their length."""
    which = text_examples.bucket_of(part.lengths, buckets)
    out = []
    for b, length in enumerate(buckets):
        members = np.flatnonzero(which == b)
        out += [(members[i : i + batch], length) for i in range(0, len(members), batch)]
    return out


def validation(s: Examples, batch: int) -> tf.data.Dataset | None:
    """Every validation example once, in batches of at most `batch` of one bucket each; None without any."""
    if s.val is None:
        return None
    batches = _val_batches(s.val, s.buckets, batch)

    def read(k: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        rows, length = batches[int(k)]
        return text_examples.padded(s.val, rows, length)

    def one(k):
        x, y = tf.numpy_function(read, [k], [tf.int32, tf.int32], stateful=False)
        return _as_batch(x, y, None)

    return _saveable(tf.data.Dataset.range(len(batches)).map(one).prefetch(2))


def _as_packed(x, seg, y, batch: int | None, length: int):
    for t in (x, seg, y):
        t.set_shape([batch, length])
    return {"token_ids": x, "segment_ids": seg}, {Examples.TARGET: y}


def packed_training(s: Examples, batch: int, shuffle: bool, seed: int) -> tf.data.Dataset:
    """`data.pack`: the endless stream of `({"token_ids", "segment_ids"}, {"next": y})` batches of `batch`
    windows, each window packed once (`text_examples.pack`), the windows shuffled per epoch from the seed
    and the epoch (the position: a counter of batches, as for buckets)."""
    length = s.buckets[0]
    windows = text_examples.pack(s.train.lengths, length)
    per_epoch = len(windows) // batch
    if not per_epoch:
        raise ConfigError(
            f"data.pack=true packs the training examples into {len(windows)} windows of {length}, fewer than "
            f"a batch of {batch}; give more text or a smaller data.batch_size"
        )

    def read(g: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        epoch, i = divmod(int(g), per_epoch)
        order = np.random.default_rng([seed, epoch]).permutation(len(windows)) if shuffle else np.arange(len(windows))
        return text_examples.packed(s.train, [windows[j] for j in order[i * batch : (i + 1) * batch]], length)

    def one(g):
        x, seg, y = tf.numpy_function(read, [g], [tf.int32, tf.int32, tf.int32], stateful=False)
        return _as_packed(x, seg, y, batch, length)

    return _saveable(tf.data.Dataset.counter(dtype=tf.int64).map(one).prefetch(2))


def packed_validation(s: Examples, batch: int) -> tf.data.Dataset | None:
    """`data.pack`: every validation window once, in order, in batches of at most `batch`; None without any."""
    if s.val is None:
        return None
    length = s.buckets[0]
    windows = text_examples.pack(s.val.lengths, length)

    def read(k: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        return text_examples.packed(s.val, windows[int(k) * batch : (int(k) + 1) * batch], length)

    def one(k):
        x, seg, y = tf.numpy_function(read, [k], [tf.int32, tf.int32, tf.int32], stateful=False)
        return _as_packed(x, seg, y, None, length)

    batches = -(-len(windows) // batch)
    return _saveable(tf.data.Dataset.range(batches).map(one).prefetch(2))
