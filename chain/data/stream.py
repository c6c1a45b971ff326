"""The input stream, the same for every data source: one `tf.data` stream of training batches
shared by every stage, and the validation set in batches. A streamed data set
(`data.stream=true`) is read from its files by `chain.data.record_stream`."""

from __future__ import annotations

from chain.data.loader import Dataset


def training_batches(ds: Dataset, batch: int, shuffle: bool, seed: int):
    """The run's endless `tf.data` stream of `(x, {target: y})` batches of `batch` examples
    (one optimizer step's: `trainer.grad_accum` x `data.batch_size`), shuffled with `seed`.

    What is shuffled, repeated and batched is the examples' indices; each batch of indices
    then gathers its examples from the arrays in one graph op (no Python per batch). The
    iterator is checkpointable, and its state is small (positions and the shuffle buffer of
    indices, not of examples), which is what makes a resumed run see the batches it would
    have seen. Batching a shuffled, repeated stream, a batch of N x B examples holds the
    same examples, in the same order, as N consecutive batches of B.
    """
    import tensorflow as tf

    if ds.shards is not None:
        from chain.data import record_stream

        if ds.skipped is None:
            ds.skipped = record_stream.skip_counter(ds.shards)
        return record_stream.training(ds.shards, batch, shuffle, seed, ds.skipped)
    x = tf.constant(ds.x)
    ys = {k: tf.constant(v) for k, v in ds.y.items()}
    order = tf.data.Dataset.range(len(ds.x))
    if shuffle:
        order = order.shuffle(len(ds.x), seed=seed, reshuffle_each_iteration=True)
    batches = order.repeat().batch(batch, drop_remainder=True)
    return batches.map(lambda i: (tf.gather(x, i), {k: tf.gather(v, i) for k, v in ys.items()})
                       ).prefetch(tf.data.AUTOTUNE)


def validation_batches(ds: Dataset, batch: int):
    """The validation examples once, in order, in batches of at most `batch`; None without any."""
    import tensorflow as tf

    if ds.shards is not None:
        from chain.data import record_stream

        if ds.skipped is None:
            ds.skipped = record_stream.skip_counter(ds.shards)
        return record_stream.validation(ds.shards, batch, ds.skipped)
    if ds.val_x is None:
        return None
    return tf.data.Dataset.from_tensor_slices((ds.val_x, ds.val_y)).batch(batch).prefetch(tf.data.AUTOTUNE)
