"""Examples of different lengths batched by length bucket, what the streams of an `int64[None]` TFRecord
input (`tfrecord_varlen`) and of an `.npz` file's ragged ids (`npz_ragged`) share: each batch holds
examples of one bucket, padded with 0 to the bucket's length, so the compiled step is traced once per
bucket. `tf.data`'s own `bucket_by_sequence_length`: checkpointable (each bucket's partial group is in
the iterator's state)."""

from __future__ import annotations

import tensorflow as tf


def bucketed(examples: tf.data.Dataset, buckets: tuple[int, ...], batch: int, whole: bool) -> tf.data.Dataset:
    """Examples `(x [L], {target: y})` -> batches of one bucket each, padded with 0 to its length (`whole`:
    only whole batches; a bucket's remainder waits in its group)."""
    bounds = [b + 1 for b in buckets]  # a length below b + 1 fits bucket b
    return examples.bucket_by_sequence_length(
        lambda x, ys: tf.shape(x)[0],
        bounds,
        [batch] * (len(bounds) + 1),
        pad_to_bucket_boundary=True,
        drop_remainder=whole,
    )
