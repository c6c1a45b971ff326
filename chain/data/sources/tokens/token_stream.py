"""The `tf.data` stream of a token file (`data=tokens`, `token_record.TokenFiles`).

What the stream's position is: a counter of examples, the only state of the pipeline. Example g's
window start is a pure function of g and the seed: `sequential`, the window
`index_shuffle(g mod W)` of epoch g div W (a permutation of the W windows drawn from the seed and the
epoch, without a buffer; in order without `data.shuffle`); `random`, a start drawn from
`stateless_uniform` seeded by (seed, g). So a checkpoint holds a few bytes of stream, and a resumed
run reads exactly the windows it would have read. The windows are read from the file memory-mapped
(NumPy, through `tf.numpy_function`: TensorFlow has no random-access file read), a batch at a time.
That read depends on nothing but its starts, so the stream is saved with
`ExternalStatePolicy.IGNORE` (a `numpy_function` is otherwise refused as state it cannot save).

Ids stay integers: inputs int32 (uint16 files) or int64 (uint32), targets int32.
"""

from __future__ import annotations

import functools

import numpy as np
import tensorflow as tf

from chain.data.sources.tokens.token_record import TokenFiles, TokenPart
from chain.data.verify import input_dtype


@functools.lru_cache(maxsize=64)
def _ids(path: str, dtype: str) -> np.ndarray:
    return np.memmap(path, dtype=dtype, mode="r")


def _tokens(part: TokenPart, start: int, stop: int) -> np.ndarray:
    """Tokens `start`..`stop` of the part's files one after the other (a window may span two)."""
    pieces, first = [], 0
    for path, n in zip(part.paths, part.sizes):
        if first < stop and start < first + n:
            pieces.append(_ids(path, part.dtype)[max(start - first, 0) : min(stop - first, n)])
        first += n
    return pieces[0] if len(pieces) == 1 else np.concatenate(pieces)


def _reader(part: TokenPart):
    """starts (int64 [n]) -> (x [n, seq_len], y [n, seq_len]): each window and the same one token on."""
    x_dtype = input_dtype(np.dtype(part.dtype))
    s = part.seq_len

    def read(starts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        windows = (
            np.stack([_tokens(part, i, i + s + 1) for i in starts.tolist()]) if len(starts) else np.zeros((0, s + 1))
        )
        return windows[:, :-1].astype(x_dtype), windows[:, 1:].astype(np.int32)

    def batch(starts):
        x, y = tf.numpy_function(read, [starts], [tf.as_dtype(x_dtype), tf.int32], stateful=False)
        x.set_shape([None, s])
        y.set_shape([None, s])
        return x, {TokenFiles.TARGET: y}

    return batch


def _saveable(ds: tf.data.Dataset) -> tf.data.Dataset:
    options = tf.data.Options()
    options.experimental_external_state_policy = tf.data.experimental.ExternalStatePolicy.IGNORE
    return ds.with_options(options)


def _start(files: TokenFiles, shuffle: bool, seed: int):
    """Example number g (int64) -> its window's first token in the file (see the module)."""
    part = files.train
    count, s = part.windows, part.seq_len

    def start(g):
        if files.windows == "random":  # any token that leaves a whole window after it
            last = part.stop - part.start - s - 1
            draw = tf.random.stateless_uniform(
                [], seed=tf.stack([tf.constant(seed, tf.int64), g]), minval=0, maxval=last + 1, dtype=tf.int64
            )
            return part.start + draw
        i = g % count
        if shuffle:
            epoch = g // count
            i = tf.random.experimental.index_shuffle(i, tf.stack([tf.constant(seed, tf.int64), epoch]), count - 1)
        return part.start + i * s

    return start


def training(files: TokenFiles, batch: int, shuffle: bool, seed: int) -> tf.data.Dataset:
    """The endless stream of `(x, {"next": y})` batches of `batch` windows (see the module)."""
    starts = tf.data.Dataset.counter(dtype=tf.int64).map(_start(files, shuffle, seed))
    ds = starts.batch(batch, drop_remainder=True).map(_reader(files.train))
    return _saveable(ds.prefetch(tf.data.AUTOTUNE))


def validation(files: TokenFiles, batch: int) -> tf.data.Dataset | None:
    """Every validation window once, in order, in batches of at most `batch`; None without any."""
    part = files.val
    if part is None:
        return None
    starts = tf.data.Dataset.range(part.windows).map(lambda i: part.start + i * part.seq_len)
    return _saveable(starts.batch(batch).map(_reader(part)).prefetch(tf.data.AUTOTUNE))
