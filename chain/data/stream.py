"""The input stream, the same for every data source: one `tf.data` stream of training batches
shared by every stage, and the validation set in batches. A streamed data set
(`data.stream=true`) is read from its files by `chain.data.record_stream`."""

from __future__ import annotations

from chain.data.loader import Dataset
from chain.data.stream_shares import StreamShares


def training_batches(ds: Dataset, batch: int, shuffle: bool, seed: int, shares: StreamShares | None = None):
    """The run's endless `tf.data` stream of `(x, {target: y})` batches of `batch` examples
    (one optimizer step's: `trainer.grad_accum` x `data.batch_size`), shuffled with `seed`.

    `shares` (mirrored replicas, `chain.data.stream_shares`): a streamed data set is read as one
    stream per replica of this process, each over its own files with its share of the batch
    (`batch / shares.replicas`), and a batch is their batches one after the other in replica order
    (`shares.count` shares: a host of a multi-host run reads its own replicas' only). One iterator
    over them all, so a checkpoint holds every replica's stream. Only a streamed data set is read
    in shares (data in memory: every process reads whole batches, and `shares` must be None).

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
        if shares is None:
            return record_stream.training(ds.shards, batch, shuffle, seed, ds.skipped)
        part = batch // shares.replicas
        streams = tuple(record_stream.training(ds.shards, part, shuffle, seed, ds.skipped, (r, shares.replicas))
                        for r in shares.indices)
        return tf.data.Dataset.zip(streams).map(_joined).prefetch(tf.data.AUTOTUNE)
    if shares is not None:
        raise ValueError("data in memory is read in whole batches, not in replicas' shares")
    x = tf.constant(ds.x)
    ys = {k: tf.constant(v) for k, v in ds.y.items()}
    order = tf.data.Dataset.range(len(ds.x))
    if shuffle:
        order = order.shuffle(len(ds.x), seed=seed, reshuffle_each_iteration=True)
    batches = order.repeat().batch(batch, drop_remainder=True)
    return batches.map(lambda i: (tf.gather(x, i), {k: tf.gather(v, i) for k, v in ys.items()})
                       ).prefetch(tf.data.AUTOTUNE)


def _joined(*parts):
    """Replicas' batches `(x, {target: y})` -> one batch: theirs one after the other, in replica order."""
    import tensorflow as tf

    xs, ys = zip(*parts)
    return tf.concat(xs, 0), {k: tf.concat([y[k] for y in ys], 0) for k in ys[0]}


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
