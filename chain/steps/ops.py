"""Small graph pieces every training step uses: explicit copies between devices, chunks of
a batch, gradient sums."""

from __future__ import annotations

from typing import Any, Sequence

import tensorflow as tf

COPY_PREFIX = "copy_to_"


def copy_to(tensor: Any, device: str, what: str) -> Any:
    """Copy `tensor` onto `device`: the only way data moves between stages' devices.

    An identity op placed on the destination device, named `copy_to_<what>`, so the graph
    states every transfer (the graph audit in tests/ relies on the name). A structure of tensors
    (several tensors crossing a cut, a dict of inputs) is copied leaf by leaf, the first leaf
    named `copy_to_<what>`, leaf i `copy_to_<what>_<i>`.
    """
    if tf.is_tensor(tensor):
        with tf.device(device):
            return tf.identity(tensor, name=f"{COPY_PREFIX}{what}")
    flat = tf.nest.flatten(tensor)
    return tf.nest.pack_sequence_as(
        tensor, [copy_to(t, device, what if i == 0 else f"{what}_{i}") for i, t in enumerate(flat)]
    )


def differentiable(h: Any) -> list[tf.Tensor]:
    """The leaves of `h` (a tensor or a structure) a gradient flows through: the floating ones.
    Integer and boolean leaves (token ids, masks) cross a cut without a gradient."""
    return [t for t in tf.nest.flatten(h) if t.dtype.is_floating]


def input_gradient(h: Any, grads: Sequence) -> Any:
    """What goes back to the previous stage for input `h`, from the gradients of `differentiable(h)`:
    the one gradient of a single tensor (as it was), else a list with zeros where none reached a
    leaf (the previous stage's backward takes one gradient per floating output)."""
    if tf.is_tensor(h):
        return grads[0]
    return [tf.zeros_like(t) if g is None else tf.convert_to_tensor(g) for t, g in zip(differentiable(h), grads)]


def chunks_of(t: Any, n: int) -> list[Any]:
    """`chunks` of every leaf of `t` (a tensor or a structure): n structures, each leaf cut along the
    batch axis."""
    if tf.is_tensor(t):
        return chunks(t, n)
    parts = [chunks(leaf, n) for leaf in tf.nest.flatten(t)]
    return [tf.nest.pack_sequence_as(t, [p[i] for p in parts]) for i in range(n)]


def chunks(t: tf.Tensor, n: int) -> list[tf.Tensor]:
    """`t` cut into `n` equal parts along the batch axis (`[t]` itself for n=1: no split op)."""
    return [t] if n == 1 else tf.split(t, n, name="chunks")


def add_grads(acc: list | None, grads: Sequence) -> list:
    """Accumulate `grads` into `acc` elementwise (None: no gradient so far).

    An embedding's gradient (IndexedSlices: one row per token) is summed by joining the rows: the
    sum of microbatches' sparse gradients is then the whole batch's sparse gradient, row for row,
    which Keras' optimizers update as `model.fit` does on one device (Adam's sparse update is not
    its update of the same gradient densified: docs/optimizers.md). A sparse and a dense
    gradient of one variable are summed dense."""
    if acc is None:
        return list(grads)
    return [g if a is None else a if g is None else _sum(a, g) for a, g in zip(acc, grads)]


def _sum(a: Any, b: Any) -> Any:
    if isinstance(a, tf.IndexedSlices) and isinstance(b, tf.IndexedSlices):
        return tf.IndexedSlices(tf.concat([a.values, b.values], 0), tf.concat([a.indices, b.indices], 0), a.dense_shape)
    return _dense(a) + _dense(b)


def _dense(g: Any) -> Any:
    return tf.convert_to_tensor(g) if isinstance(g, tf.IndexedSlices) else g


def after(grads: list | None) -> list[tf.Tensor]:
    """What the next chunk waits for: the gradients accumulated so far (so that chunks run one
    at a time and only one chunk's activations are alive, which is what gradient accumulation
    is for; a dataflow graph would otherwise run all chunks at once)."""
    return [g for g in grads or [] if g is not None]


def weighted(loss: tf.Tensor, weight) -> tf.Tensor:
    """`loss` times `weight` (a chunk's share of the step's examples); no op for a weight of 1."""
    return loss if isinstance(weight, float) and weight == 1.0 else loss * weight
