"""Evaluation on the whole validation set, compiled: one `tf.function` loops over the batches.

A *read-out* is one prediction of a target that is scored: in mode=local each stage's
head, in mode=e2e the chain's output (`chain.strategies.base`). For each batch, every
stage's forward pass runs on its own device (`chain.steps.inference.forward`), and each
read-out's sums are computed on its stage's device: the loss times the examples, the
correct predictions (class labels) or the absolute errors (values), and the examples. A
read-out's loss includes the regularization of the stages it follows (`Readout.regularized`),
as the training loss and Keras' `evaluate` do.
Summed over the batches in float64, they become means: `loss`, and `accuracy` or `mae`. A
validation set that gives no example has no mean: a one-line ConfigError, never a 0 or a
division by zero (the sources refuse an empty validation file before training; this guards
what shows only while reading, e.g. a user's dataset shorter than `data.examples` says).

Nothing is trained and no random state is drawn (dropout is off), so evaluating leaves a
run exactly where it was. In a mirrored run the models are read in cross-replica context
(every replica holds the same variables) and the read-outs have no device of their own.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

import tensorflow as tf

from chain.data.catalog import Target
from chain.errors import ConfigError
from chain.stages import losses
from chain.stages.stage import Stage
from chain.steps.inference import forward
from chain.steps.ops import copy_to


@dataclass(frozen=True)
class Readout:
    """One scored prediction: the `forward` output called `output` (e.g. `head_1`) predicts
    `target` on `device`, with `loss(y, pred)` (a mean over the batch)."""

    output: str
    device: str | None
    target: Target
    loss: Callable
    regularized: tuple[int, ...] = ()  # the stages whose regularization its loss includes, as in training

    @property
    def metric(self) -> str:
        """`accuracy` for class labels, `mae` (mean absolute error) for a value."""
        return "mae" if self.target.is_regression else "accuracy"


def _sums(r: Readout, pred: tf.Tensor, y: tf.Tensor, extra: tf.Tensor | None) -> dict[str, tf.Tensor]:
    pred = tf.cast(pred, tf.float32)
    ignore_class = getattr(r.loss, "ignore_class", None)
    if r.target.shape or ignore_class is not None:
        return _label_sums(r, pred, y, extra, ignore_class)
    n = tf.shape(pred)[0]
    if r.target.is_regression:
        score = tf.reduce_sum(tf.abs(tf.reshape(pred, [-1]) - tf.reshape(tf.cast(y, tf.float32), [-1])))
    else:
        hits = tf.equal(tf.argmax(pred, axis=-1, output_type=tf.int32), tf.reshape(tf.cast(y, tf.int32), [-1]))
        score = tf.reduce_sum(tf.cast(hits, tf.float32))
    loss = r.loss(y, pred)
    loss = (loss if extra is None else loss + extra) * tf.cast(n, tf.float32)
    return {"loss": tf.cast(loss, tf.float64), r.metric: tf.cast(score, tf.float64), "count": tf.cast(n, tf.float64)}


def _label_sums(
    r: Readout, pred: tf.Tensor, y: tf.Tensor, extra: tf.Tensor | None, ignore_class: int | None
) -> dict[str, tf.Tensor]:
    """`_sums` counted per label (a label per position, or labels `ignore_class` leaves out): the loss
    and the correct predictions over the labels that count, and their number, so that the means are
    per token over the whole validation set (a token's accuracy, the loss a one-device run logs)."""
    labels = tf.reshape(tf.cast(y, tf.int32), [-1])
    real = tf.ones_like(labels, tf.bool) if ignore_class is None else tf.not_equal(labels, ignore_class)
    n = tf.reduce_sum(tf.cast(real, tf.float32))
    guesses = tf.argmax(tf.reshape(pred, [-1, r.target.classes]), axis=-1, output_type=tf.int32)
    score = tf.reduce_sum(tf.cast(tf.logical_and(real, tf.equal(guesses, labels)), tf.float32))
    # The regularization is per batch, as for labels per example (Keras' evaluate adds it to each batch's mean).
    loss = r.loss(y, pred)
    loss = (loss if extra is None else loss + extra) * n
    return {"loss": tf.cast(loss, tf.float64), r.metric: tf.cast(score, tf.float64), "count": tf.cast(n, tf.float64)}


def evaluation(stages: Sequence[Stage], readouts: Sequence[Readout], chained: bool = True) -> Callable:
    """`evaluate(dataset) -> [{"loss": mean, "accuracy" | "mae": mean} per read-out]` over every
    batch `(x, {target: y})` of `dataset` (finite); `chained=False`: every stage takes `x`."""

    @tf.autograph.experimental.do_not_convert  # only `totals` loops over a dataset (see set_step)
    def batch(x: tf.Tensor, ys: dict[str, tf.Tensor]) -> tuple[dict[str, tf.Tensor], ...]:
        out = forward(stages, x, chained)
        regs = {}  # each stage's regularization of this batch's call (Keras' evaluate adds it too)
        for s in stages:
            with tf.device(s.device):
                term = losses.regularization(s.model, s.head)
            if term is not None:
                regs[s.index] = term
        sums = []
        for i, r in enumerate(readouts):
            terms = [copy_to(regs[k], r.device, f"eval_{i}_regularization_s{k}") for k in r.regularized if k in regs]
            with tf.device(r.device):
                extra = None if not terms else terms[0] if len(terms) == 1 else tf.add_n(terms)
                sums.append(_sums(r, out[r.output], copy_to(ys[r.target.name], r.device, f"eval_{i}_target"), extra))
        return tuple(sums)

    @tf.function
    def totals(dataset: tf.data.Dataset) -> tuple[dict[str, tf.Tensor], ...]:
        zero = tf.constant(0.0, tf.float64)
        acc = tuple({"loss": zero, r.metric: zero, "count": zero} for r in readouts)  # a tuple: autograph
        for x, ys in dataset:  # stages lists as arrays
            acc = tf.nest.map_structure(tf.add, acc, batch(x, ys))
        return acc

    def evaluate(dataset: tf.data.Dataset) -> list[dict[str, float]]:
        out = []
        for t in totals(dataset):
            n = float(t["count"].numpy())
            if n == 0:
                raise ConfigError(
                    "the validation set gave no example, so its loss and metrics are undefined; "
                    "give validation data that holds examples, or data.val_fraction=0 (no validation)"
                )
            out.append({k: float(v.numpy()) / n for k, v in t.items() if k != "count"})
        return out

    return evaluate


def validation_loss(metrics: dict[str, float] | None) -> float | None:
    """The `loss` of one read-out's metrics (what `evaluation`'s function returns), or None without them."""
    return (metrics or {}).get("loss")
