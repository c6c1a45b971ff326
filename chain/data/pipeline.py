"""The input pipeline: one `tf.data` stream of training batches shared by every stage."""

from __future__ import annotations

from chain.data.sources import Dataset


def training_batches(ds: Dataset, batch: int, shuffle: bool, seed: int):
    """The run's endless `tf.data` stream of `(x, {target: y})` batches of `batch` examples
    (one optimizer step's: `trainer.grad_accum` x `data.batch_size`), shuffled with `seed`.

    Batching a shuffled, repeated stream, a batch of N x B examples holds the same
    examples, in the same order, as N consecutive batches of B. The iterator over it is
    checkpointable, which is what makes a resumed run see the batches it would have seen.
    """
    import tensorflow as tf

    data = tf.data.Dataset.from_tensor_slices((ds.x, ds.y))
    if shuffle:
        data = data.shuffle(len(ds.x), seed=seed, reshuffle_each_iteration=True)
    return data.repeat().batch(batch, drop_remainder=True).prefetch(tf.data.AUTOTUNE)
