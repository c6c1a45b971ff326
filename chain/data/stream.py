"""The input stream, the same for every data source: one `tf.data` stream of training batches
shared by every stage, and the validation set in batches. A streamed data set
(`data.stream=true`) is read while training by its own stream: TFRecord files by
`chain.data.record_stream`, CSV files by `chain.data.csv_stream`, an `.npz` file's arrays by
`chain.data.array_stream`, the user's dataset by `chain.data.function_stream`."""

from __future__ import annotations

from chain.data.loader import Dataset
from chain.data.shards import Shards
from chain.data.streamed import ArrayFiles, CsvFiles


def _streamed(ds: Dataset, batch: int, train: bool, shuffle: bool = False, seed: int = 0):
    """The stream of a streamed data set (`ds.shards`), from the module that reads its kind."""
    if isinstance(ds.shards, (Shards, CsvFiles)):
        from chain.data import csv_stream, record_stream

        reader = record_stream if isinstance(ds.shards, Shards) else csv_stream
        if ds.skipped is None:
            ds.skipped = reader.skip_counter(ds.shards)
        if train:
            return reader.training(ds.shards, batch, shuffle, seed, ds.skipped)
        return reader.validation(ds.shards, batch, ds.skipped)
    from chain.data import array_stream, function_stream

    reader = array_stream if isinstance(ds.shards, ArrayFiles) else function_stream
    return reader.training(ds.shards, batch, shuffle, seed) if train else reader.validation(ds.shards, batch)


def bad_record(error: BaseException, ds: Dataset) -> str | None:
    """The one line for a bad record (or CSV row) that stopped a streamed data set, naming its file,
    or None when `error` is not one (or the data set is not streamed from files that can hold one)."""
    if isinstance(ds.shards, Shards):
        from chain.data import record_stream

        return record_stream.bad_record(error, ds.shards)
    if isinstance(ds.shards, CsvFiles):
        from chain.data import csv_stream

        return csv_stream.bad_record(error, ds.shards)
    return None


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
        return _streamed(ds, batch, True, shuffle, seed)
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
        return _streamed(ds, batch, False)
    if ds.val_x is None:
        return None
    return tf.data.Dataset.from_tensor_slices((ds.val_x, ds.val_y)).batch(batch).prefetch(tf.data.AUTOTUNE)
