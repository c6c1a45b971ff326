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
