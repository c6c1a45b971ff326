"""The losses: a stage's head loss (mode=local) and the chain's loss (mode=e2e, `loss=`).

- `sparse_categorical_crossentropy`: class labels against logits.
- `mse` on a real-valued target (`synthetic`'s `value`): squared error of the one output.
- `mse` on class labels: squared error between the logits and the one-hot labels,
  averaged over classes and examples (what `keras.losses.MeanSquaredError` gives for
  one-hot targets). Squared loss on one-hot targets is a legitimate classifier loss,
  so it is allowed rather than refused.

Cross-entropy on a real-valued target has no meaning: the config checks refuse it
(`chain.config.checks.loss_fits_target`). Every loss is the mean over the examples it
is given.

To that loss every stage adds its models' regularization (`regularization`), as Keras'
`fit` adds `model.losses` to the loss it minimizes and logs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Sequence

from chain.data.catalog import Target
from chain.internals.keras_private import all_layers


def head_loss(target: Target) -> Callable:
    """mode=local: the loss a stage's head learns `target` with (cross-entropy on class
    labels, squared error on a value)."""
    return make("mse" if target.is_regression else "sparse_categorical_crossentropy", target)


@dataclass(frozen=True)
class Loss:
    """A loss `fn(y, pred)` and what the steps need to weigh it over microbatches.

    Without `ignore_class` every label counts and a microbatch's mean loss has weight 1/M (its
    share of the batch's examples). With `ignore_class=P`, labels equal to P (padding) count for
    nothing: a microbatch's loss is the mean over its real labels, and its weight is its real
    labels' share of the whole batch's (`weights`), so that the batch's loss is the mean over all
    its real labels, as one device computes it, whatever number each microbatch holds.
    """

    fn: Callable
    ignore_class: int | None = None

    def __call__(self, y, pred):
        return self.fn(y, pred)

    def real(self, y):
        """How many labels of `y` count (float32): all, or those that are not `ignore_class`."""
        import tensorflow as tf

        if self.ignore_class is None:
            return tf.cast(tf.size(y), tf.float32)
        return tf.reduce_sum(tf.cast(tf.not_equal(tf.cast(y, tf.int32), self.ignore_class), tf.float32))

    def weights(self, labels: Sequence, total: Any = None, scale: float = 1.0) -> list | None:
        """Each microbatch's weight in the batch's loss, given every microbatch's labels (all of the
        step's, before any is used: the backward needs the weight): its real labels over all of them
        (`total`: over a whole batch of which `labels` are a share, times `scale`: R copies of a pipeline,
        each a share, whose gradients are averaged). None without `ignore_class` (then every microbatch
        weighs 1/M)."""
        import tensorflow as tf

        if self.ignore_class is None:
            return None
        counts = [self.real(y) for y in labels]
        total = tf.maximum(tf.add_n(counts) if total is None else total, 1.0)  # padding only: weights 0, not NaN
        return [c * scale / total for c in counts]


@dataclass
class WholeBatch:
    """The real labels of the whole batch a step is tracing (`real`, a tensor of its graph; None before the
    step sets it): what each copy's share is weighed against (`ShareOfBatch`)."""

    real: Any = None


@dataclass(frozen=True)
class ShareOfBatch:
    """A copy's loss when R copies of a pipeline each take a share of the batch (`placement.replicas`) and
    their gradients and losses are averaged: with `ignore_class`, a microbatch weighs its real labels over
    the whole batch's (`whole.real`, set by the step as it traces, before any copy plays), times R, so
    that the average over the copies is the mean over the whole batch's real labels, as on one device."""

    loss: Loss
    copies: int
    whole: WholeBatch

    def __call__(self, y, pred):
        return self.loss(y, pred)

    def weights(self, labels: Sequence) -> list | None:
        return self.loss.weights(labels, self.whole.real, float(self.copies))


def make(name: str, target: Target, ignore_class: int | None = None) -> Loss:
    """`Loss(fn)`, `fn(y, pred)`: the mean loss over the labels of `pred` (logits, or one value per
    example; a label per position: logits of shape (N, seq, classes), every position a label) that
    are not `ignore_class` (a padding id; None: all count)."""
    import tensorflow as tf

    # Targets are flattened to (N,) here too, so that a (N, 1) target can never broadcast
    # against (N,) predictions into an (N, N) loss (chain.data.verify normalises them first).
    # Labels per position and their logits are flattened alike: (N x seq,) and (N x seq, classes).
    if name == "sparse_categorical_crossentropy":

        def each(y, pred):
            return tf.keras.losses.sparse_categorical_crossentropy(
                y, tf.reshape(tf.cast(pred, tf.float32), [-1, target.classes]), from_logits=True
            )
    elif target.is_regression:

        def fn(y, pred):
            return tf.reduce_mean(
                tf.square(tf.reshape(tf.cast(pred, tf.float32), [-1]) - tf.reshape(tf.cast(y, tf.float32), [-1]))
            )

        return Loss(fn)
    else:

        def each(y, pred):
            one_hot = tf.one_hot(y, target.classes, dtype=tf.float32)
            return tf.reduce_mean(tf.square(tf.reshape(tf.cast(pred, tf.float32), [-1, target.classes]) - one_hot), -1)

    if ignore_class is None and name != "sparse_categorical_crossentropy":

        def fn(y, pred):  # one mean over labels and classes (as before labels per position)
            one_hot = tf.one_hot(tf.reshape(tf.cast(y, tf.int32), [-1]), target.classes, dtype=tf.float32)
            return tf.reduce_mean(tf.square(tf.reshape(tf.cast(pred, tf.float32), [-1, target.classes]) - one_hot))
    elif ignore_class is None:

        def fn(y, pred):
            return tf.reduce_mean(each(tf.reshape(y, [-1]), pred))
    else:

        def fn(y, pred):
            y = tf.reshape(tf.cast(y, tf.int32), [-1])
            real = tf.not_equal(y, ignore_class)
            terms = each(tf.where(real, y, tf.zeros_like(y)), pred) * tf.cast(real, tf.float32)
            # The mean over the real labels (a microbatch of padding only: 0, weighed 0 by `weights`).
            return tf.reduce_sum(terms) / tf.maximum(tf.reduce_sum(tf.cast(real, tf.float32)), 1.0)

    return Loss(fn, ignore_class)


def regularization(*models: Any) -> Any:
    """The sum of `model.losses` over `models` (None entries skipped) in float32, or None if
    they have none: what Keras' `fit` adds to the loss (weight regularizers, the activity
    regularizers and `add_loss` terms of the models' latest call).

    Call it right after the models' forward pass, inside the same tape and device scope, so
    the terms are that call's and their gradient is taken with the loss. Keras' activity
    regularizers are divided by the batch size (a mean over the examples), so weighting the
    term by a microbatch's share of the batch, as the loss is, sums to the full batch's term.
    """
    import tensorflow as tf

    terms = [tf.cast(term, tf.float32) for m in models if m is not None for term in m.losses]
    if not terms:
        return None
    return terms[0] if len(terms) == 1 else tf.add_n(terms)


def added_losses(model: Any) -> int:
    """How many terms `model`'s layers add with `add_loss` when called (activity regularizers
    not counted): one training call on two zero examples inside Keras' `StatelessScope`, which
    collects the terms and leaves every variable (weights, statistics, dropout seeds) as it was.

    Keras defines an activity regularizer per example (divided by the batch size), so its value
    on part of a batch, weighted by the part's share, adds up to the whole batch's; an `add_loss`
    term is whatever the layer computes, and need not.
    """
    import warnings

    import keras

    switched = [layer for layer in all_layers(model) if layer.activity_regularizer is not None]
    kept = [layer.activity_regularizer for layer in switched]
    zeros = keras.tree.map_structure(
        lambda inp: keras.ops.zeros((2, *[d or 1 for d in inp.shape[1:]]), dtype=inp.dtype),
        model.input if len(model.inputs) > 1 else model.inputs[0],
    )  # a dict of named inputs
    try:
        for layer in switched:
            layer.activity_regularizer = None
        # The probe's length-1 sequences make attention's softmax warn about a size-1 axis: not the user's run.
        with keras.StatelessScope(collect_losses=True) as scope, warnings.catch_warnings():
            warnings.simplefilter("ignore")
            model(zeros, training=True)
        return len(scope.losses)
    finally:
        for layer, regularizer in zip(switched, kept):
            layer.activity_regularizer = regularizer


def regularized(*models: Any) -> bool:
    """Whether `models` (None entries skipped) have weight or activity regularizers, known
    without calling them (an `add_loss` term shows only in a call: `added_losses`)."""
    for m in models:
        if m is not None and (
            any(w.regularizer is not None for w in m.trainable_weights)
            or any(layer.activity_regularizer is not None for layer in all_layers(m))
        ):
            return True
    return False
