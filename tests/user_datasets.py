"""A user's data function, for `data=callable data._target_=user_datasets.make_dataset` in tests."""

import numpy as np
import tensorflow as tf


def arrays(n: int = 48, features: int = 6, seed: int = 1):
    """Inputs and two targets: `cls` (0/1: do the features sum past their mean?) and `val` (their mean)."""
    x = np.random.default_rng(seed).random((n, features)).astype("float32")
    return x, {"cls": (x.sum(1) > features / 2).astype("int32"), "val": x.mean(1)}


def make_dataset(n: int = 48, features: int = 6, several: bool = False) -> tf.data.Dataset:
    """`(x, cls)` examples, or `(x, {"cls": ..., "val": ...})` with `several`."""
    x, ys = arrays(n, features)
    return tf.data.Dataset.from_tensor_slices((x, ys if several else ys["cls"]))


def not_a_dataset(n: int = 3):
    return list(range(n))


def endless(features: int = 3) -> tf.data.Dataset:
    """A generator that never ends (its cardinality is unknown, not infinite: it is not refused up front)."""

    def examples():
        i = 0
        while True:
            yield np.full(features, i % 7, np.float32), i % 2
            i += 1

    return tf.data.Dataset.from_generator(
        examples, output_signature=(tf.TensorSpec((features,), tf.float32), tf.TensorSpec((), tf.int64))
    )


def nothing_passes() -> tf.data.Dataset:
    """An endless stream whose filter drops every example: reading it never yields one."""
    counter = tf.data.Dataset.counter()
    return counter.filter(lambda i: i < 0).map(lambda i: (tf.fill([3], tf.cast(i, tf.float32)), i))


def broken() -> tf.data.Dataset:
    raise RuntimeError("the function failed on purpose")
