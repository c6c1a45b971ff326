"""The `tf.data` stream of TFRecord files whose input is `int64[None]` (ids of any length,
`tfrecord_record.Shards.buckets`): records parsed one at a time (the ids of different lengths cannot
be one dense chunk), cut to the largest bucket, shuffled in a buffer of `data.shuffle_buffer` examples,
then grouped by length (`chain.data.length_buckets`): each batch holds examples of one bucket, padded
with 0 to the bucket's length, whole batches only, so the compiled step is traced once per bucket. Every
stage is checkpointable: the iterator's state (the files' positions, the shuffle buffer, each bucket's
partial group) goes into every checkpoint, and a resumed run sees the batches it would have seen.
"""

from __future__ import annotations

import tensorflow as tf

from chain.data.chunks import CYCLE, shuffled
from chain.data.length_buckets import bucketed
from chain.data.sources.tfrecord.tfrecord_record import Shards
from chain.data.sources.tfrecord.tfrecord_stream import ids_checked


def _parser(shards: Shards):
    """A serialized `tf.train.Example` -> (x int64 [L], {target: y}), x cut to the largest bucket (a label per
    position cut with it); `model=gpt`'s ids checked (`Shards.ids`: the record's file is not known here)."""
    features = dict(shards.features)
    longest = shards.buckets[-1]
    spec = {
        name: tf.io.RaggedFeature(tf.int64)
        if None in shape
        else tf.io.FixedLenFeature(shape, tf.float32 if dtype == "float32" else tf.int64)
        for name, (dtype, shape) in features.items()
    }

    def parse(record):
        ex = tf.io.parse_single_example(record, spec)
        x = ex[shards.x][:longest]
        ys = {}
        for name, key, classes in shards.targets:
            y = ex[key][:longest] if None in features[key][1] else tf.reshape(ex[key], [-1])[0]
            ys[name] = tf.cast(y, tf.int32 if classes else tf.float32)
        if shards.ids is not None:
            label = ex[shards.ids.target][:longest]
            with tf.control_dependencies(ids_checked(shards.ids, shards.x, x[None], label[None], "", -1)):
                x = tf.identity(x)
        return x, ys

    return parse


def training(shards: Shards, batch: int, shuffle: bool, seed: int) -> tf.data.Dataset:
    """The endless stream of `(x, {target: y})` batches of `batch` examples, each of one bucket."""
    paths = list(shards.paths)
    files = shuffled(tf.data.Dataset.from_tensor_slices(paths), len(paths), shuffle, seed).repeat()
    records = files.interleave(tf.data.TFRecordDataset, cycle_length=min(CYCLE, len(paths)))
    examples = records.map(_parser(shards))
    if shuffle:
        examples = examples.shuffle(shards.shuffle_buffer, seed=seed)
    return bucketed(examples, shards.buckets, batch, True).prefetch(2)


def validation(shards: Shards, batch: int) -> tf.data.Dataset | None:
    """The validation files' records once, in batches of at most `batch` of one bucket each; None without any."""
    if not shards.val_paths:
        return None
    records = tf.data.TFRecordDataset(list(shards.val_paths))
    return bucketed(records.map(_parser(shards)), shards.buckets, batch, False).prefetch(2)
