"""The `tf.data` stream of a streamed data set (`data.stream=true`, `chain.data.shards.Shards`):
records read from their files while training, never gathered into NumPy.

Training: the file names, shuffled per epoch from `seed`; their records read several files at a
time (`interleave`, in parallel, in a deterministic order); each parsed; the examples shuffled in
a buffer of `shuffle_buffer`, batched and prefetched. Host memory holds the buffers, not the data
set. Every stage is checkpointable, so the iterator's state (file positions and the shuffle
buffer's examples) goes into every checkpoint as the in-memory stream's does, and a resumed run
sees the batches it would have seen.
"""

from __future__ import annotations

import tensorflow as tf

from chain.data.shards import Shards

CYCLE = 4  # files read at a time: enough to mix files and keep the reader busy, few open buffers


def _parse(shards: Shards):
    """One serialized `tf.train.Example` -> (x float32, {target: int32 label or float32 value})."""
    spec = {name: tf.io.FixedLenFeature(shape, tf.float32 if dtype == "float32" else tf.int64)
            for name, (dtype, shape) in shards.features}

    def parse(record):
        ex = tf.io.parse_single_example(record, spec)
        ys = {name: tf.cast(tf.reshape(ex[key], []), tf.int32 if classes else tf.float32)
              for name, key, classes in shards.targets}
        return tf.cast(ex[shards.x], tf.float32), ys

    return parse


def _records(paths) -> tf.data.Dataset:
    return tf.data.TFRecordDataset(paths)


def training(shards: Shards, batch: int, shuffle: bool, seed: int) -> tf.data.Dataset:
    """The endless stream of `(x, {target: y})` batches of `batch` examples (see the module)."""
    files = tf.data.Dataset.from_tensor_slices(list(shards.paths))
    if shuffle:
        files = files.shuffle(len(shards.paths), seed=seed, reshuffle_each_iteration=True)
    records = files.repeat().interleave(_records, cycle_length=min(CYCLE, len(shards.paths)), block_length=1,
                                        num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
    examples = records.map(_parse(shards), num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
    if shuffle:
        examples = examples.shuffle(shards.shuffle_buffer, seed=seed, reshuffle_each_iteration=True)
    return examples.batch(batch, drop_remainder=True).prefetch(tf.data.AUTOTUNE)


def validation(shards: Shards, batch: int) -> tf.data.Dataset | None:
    """The validation files' records once, in order, in batches of at most `batch`; None without any."""
    if not shards.val_paths:
        return None
    examples = _records(list(shards.val_paths)).map(_parse(shards), num_parallel_calls=tf.data.AUTOTUNE,
                                                   deterministic=True)
    return examples.batch(batch).prefetch(tf.data.AUTOTUNE)
