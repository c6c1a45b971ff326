"""The input stream, the same for every data source: one `tf.data` stream of training batches
shared by every stage, and the validation set in batches. A streamed data set
(`data.stream=true`, `Dataset.shards`, a `chain.data.streamed.Streamed`) opens its own stream (each
source's in its folder of `chain.data.sources`)."""

from __future__ import annotations

from chain.data.loader import Dataset
from chain.data.stream_shares import StreamShares


def _counter(ds: Dataset):
    """The stream's count of bad records left out (made once per data set)."""
    if ds.skipped is None:
        ds.skipped = ds.shards.skip_counter()
    return ds.skipped


def bad_record(error: BaseException, ds: Dataset) -> str | None:
    """The one line for a bad record (or CSV row) that stopped a streamed data set, naming its file,
    or None when `error` is not one (or the data set is not streamed from files that can hold one)."""
    return ds.shards.bad_record(error) if ds.shards is not None else None


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
        if shares is None:
            return ds.shards.training(batch, shuffle, seed, _counter(ds))
        part, skipped = batch // shares.replicas, _counter(ds)
        streams = tuple(ds.shards.training(part, shuffle, seed, skipped, (r, shares.replicas)) for r in shares.indices)
        return tf.data.Dataset.zip(streams).map(_joined).prefetch(tf.data.AUTOTUNE)
    if shares is not None:
        raise ValueError("data in memory is read in whole batches, not in replicas' shares")
    x = tf.constant(ds.x)
    ys = {k: tf.constant(v) for k, v in ds.y.items()}
    order = tf.data.Dataset.range(len(ds.x))
    if shuffle:
        order = order.shuffle(len(ds.x), seed=seed, reshuffle_each_iteration=True)
    batches = order.repeat().batch(batch, drop_remainder=True)
    return batches.map(lambda i: (tf.gather(x, i), {k: tf.gather(v, i) for k, v in ys.items()})).prefetch(
        tf.data.AUTOTUNE
    )


def _joined(*parts):
    """Replicas' batches `(x, {target: y})` -> one batch: theirs one after the other, in replica order."""
    import tensorflow as tf

    xs, ys = zip(*parts)
    return tf.concat(xs, 0), {k: tf.concat([y[k] for y in ys], 0) for k in ys[0]}


def validation_batches(ds: Dataset, batch: int):
    """The validation examples once, in order, in batches of at most `batch`; None without any."""
    import tensorflow as tf

    if ds.shards is not None:
        return ds.shards.validation(batch, _counter(ds))
    if ds.val_x is None:
        return None
    return tf.data.Dataset.from_tensor_slices((ds.val_x, ds.val_y)).batch(batch).prefetch(tf.data.AUTOTUNE)
