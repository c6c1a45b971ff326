"""The `tf.data` stream of an `.npz` file's ragged ids (`npz_ragged_parts`, `data.offsets`): example i read
in place from the memory-mapped arrays (`tf.numpy_function`: a slice of the ids, cut to the largest
bucket, and its labels), the examples in order and endlessly repeated, shuffled in a buffer of
`data.shuffle_buffer` examples, then grouped by length (`chain.data.length_buckets`) as an `int64[None]`
TFRecord input is: the same examples in one TFRecord file give the same batches. The read depends on the
example's number alone, so the stream is saved with `ExternalStatePolicy.IGNORE`: a checkpoint holds the
position, the shuffle buffer and each bucket's partial group, and a resumed run sees the batches it would
have seen.
"""

from __future__ import annotations

import functools

import numpy as np
import tensorflow as tf

from chain.data.length_buckets import bucketed
from chain.data.sources.npz.npz_members import Member
from chain.data.sources.npz.npz_record import RaggedFiles, RaggedPart


@functools.lru_cache(maxsize=16)
def _mapped(member: Member) -> np.ndarray:
    return np.memmap(member.path, np.dtype(member.dtype), "r", member.offset, member.shape)


def _examples(files: RaggedFiles, part: RaggedPart, numbers: tf.data.Dataset) -> tf.data.Dataset:
    """Example numbers -> `(x int64 [L], {target: y})`: x cut to the largest bucket, a label per id cut with
    it, a label per example one value (int32 classes, float32 values, as a TFRecord stream parses them)."""
    longest = files.buckets[-1]
    kinds = [np.int32 if classes else np.float32 for _, classes in files.targets]

    def read(i: np.ndarray) -> list[np.ndarray]:
        offsets = _mapped(part.offsets)
        start = int(offsets[int(i)])
        stop = min(int(offsets[int(i) + 1]), start + longest)
        out = [np.asarray(_mapped(part.x)[start:stop], np.int64)]
        for y, by_id, kind in zip(part.ys, files.per_id, kinds):
            out.append(np.asarray(_mapped(y)[start:stop] if by_id else _mapped(y)[int(i)].reshape(()), kind))
        return out

    def one(i):
        x, *ys = tf.numpy_function(read, [i], [tf.int64] + [tf.as_dtype(k) for k in kinds], stateful=False)
        x.set_shape([None])
        for y, by_id in zip(ys, files.per_id):
            y.set_shape([None] if by_id else [])
        return x, {name: y for (name, _), y in zip(files.targets, ys)}

    options = tf.data.Options()
    options.experimental_external_state_policy = tf.data.experimental.ExternalStatePolicy.IGNORE
    return numbers.map(one).with_options(options)


def training(files: RaggedFiles, batch: int, shuffle: bool, seed: int) -> tf.data.Dataset:
    """The endless stream of `(x, {target: y})` batches of `batch` examples, each of one bucket."""
    part = files.train
    examples = _examples(files, part, tf.data.Dataset.range(part.start, part.stop).repeat())
    if shuffle:
        examples = examples.shuffle(files.shuffle_buffer, seed=seed)
    return bucketed(examples, files.buckets, batch, True).prefetch(2)


def validation(files: RaggedFiles, batch: int) -> tf.data.Dataset | None:
    """The validation examples once, in batches of at most `batch` of one bucket each; None without any."""
    part = files.val
    if part is None:
        return None
    examples = _examples(files, part, tf.data.Dataset.range(part.start, part.stop))
    return bucketed(examples, files.buckets, batch, False).prefetch(2)
