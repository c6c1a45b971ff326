"""The chain's loss in mode=e2e: one loss after the last stage, chosen by `loss=`.

- `sparse_categorical_crossentropy`: class labels against the last stage's logits.
- `mse` on a real-valued target (`synthetic`'s `value`): squared error of the one output.
- `mse` on class labels: squared error between the logits and the one-hot labels,
  averaged over classes and examples (what `keras.losses.MeanSquaredError` gives for
  one-hot targets). Squared loss on one-hot targets is a legitimate classifier loss,
  so it is allowed rather than refused.

Cross-entropy on a real-valued target has no meaning and is refused before training.
Every loss is the mean over the examples it is given.
"""

from __future__ import annotations

from typing import Callable

from chain.data import Target
from chain.errors import ConfigError


def check(name: str, target: Target, data: str) -> None:
    """Raise ConfigError if loss `name` cannot learn `target` of data set `data`."""
    if name == "sparse_categorical_crossentropy" and target.is_regression:
        raise ConfigError(
            f"loss={name} needs class labels, but target {target.name!r} of data={data} is a real value; "
            "use loss=mse (or a class target: stage.target=label)"
        )


def head_loss(target: Target) -> Callable:
    """mode=local: the loss a stage's head learns `target` with (cross-entropy on class
    labels, squared error on a value)."""
    return make("mse" if target.is_regression else "sparse_categorical_crossentropy", target)


def make(name: str, target: Target, data: str = "?") -> Callable:
    """`fn(y, pred)`: the mean loss over the examples of `pred` (logits, or one value per example)."""
    import tensorflow as tf

    check(name, target, data)

    if name == "sparse_categorical_crossentropy":
        def fn(y, pred):
            return tf.reduce_mean(
                tf.keras.losses.sparse_categorical_crossentropy(y, tf.cast(pred, tf.float32), from_logits=True))
    elif target.is_regression:
        def fn(y, pred):
            return tf.reduce_mean(tf.square(tf.reshape(tf.cast(pred, tf.float32), [-1]) - tf.cast(y, tf.float32)))
    else:
        def fn(y, pred):
            one_hot = tf.one_hot(tf.cast(y, tf.int32), target.classes, dtype=tf.float32)
            return tf.reduce_mean(tf.square(tf.cast(pred, tf.float32) - one_hot))
    return fn
