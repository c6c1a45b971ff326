"""Clipping a chain's gradients by their global norm (`optim.clip_global_norm`, mode=e2e).

The chain is one network with one loss, so its gradients are clipped as one device's Keras
optimizer with `global_clipnorm=C` clips the whole model's: by the norm over every stage's
gradients, not each stage's own (which is what one `global_clipnorm` optimizer per stage
would do, silently). Each stage sums its gradients' squares on its device; those scalars,
one per stage, cross to one device, where the norm and the factor
`C * min(1/norm, 1/C)` are computed (Keras' `clip_by_global_norm`, NaN when the norm is not
finite); the factor crosses back and each stage multiplies its gradients by it on its device. Only
scalars cross. The factor is also the numerics guard's verdict (`Clipped.finite`): it is finite exactly
when the norm is, that is when every gradient it sums is finite (and their squares' sum does not
overflow), and then so are the clipped gradients; the guard needs no pass of its own over them.

Callers pass true gradients: under float16 after unscaling, with mirrored replicas after
the all-reduce, with gradient accumulation the accumulated sum.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence, Set

import tensorflow as tf

from chain.stages.stage import Stage
from chain.steps.ops import copy_to


def squared_sum(grads: Sequence[tf.Tensor | None]) -> tf.Tensor:
    """The sum of the squares of every element of `grads` (float32; 0 without gradients); of an
    IndexedSlices, of its rows (Keras' `global_norm` of the same gradient: a token's row counts
    once per occurrence, not their sum)."""
    # An embedding's sparse gradient counts each token's row (its values), as Keras' global_norm does
    parts = [
        tf.reduce_sum(tf.square(tf.cast(g.values if isinstance(g, tf.IndexedSlices) else g, tf.float32)))
        for g in grads
        if g is not None
    ]
    return tf.add_n(parts) if parts else tf.constant(0.0)


def factor(norm: tf.Tensor, clip: float) -> tf.Tensor:
    """Keras' `clip_by_global_norm` factor: 1 up to `clip`, `clip / norm` above; NaN for a norm
    that is not finite."""
    return clip * tf.minimum(1.0 / norm, 1.0 / clip) + (norm - norm)


@dataclass(frozen=True)
class Clipped:
    """The chain's gradients clipped by their global norm (`clip_global`)."""

    grads: list[list[tf.Tensor | None]]  # each stage's, scaled by the factor
    norm: tf.Tensor  # the global norm, on the device that computed it
    finite: list[tf.Tensor]  # each stage's guard verdict, on its device: the factor (so the norm) is finite


def clip_global(
    stages: Sequence[Stage],
    grads: Sequence[Sequence[tf.Tensor | None]],
    clip: float,
    device: str | None,
    later_copies: Set[tuple[int, int]] = frozenset(),
) -> Clipped:
    """Every stage's gradients scaled by the factor of their global norm (`clip`, see the module
    doc), that norm (on `device`, where it is computed: None in a mirrored run, whose stages
    have no device) and each stage's verdict for the numerics guard. `later_copies`: (stage, position)
    of gradients left out of the norm (the second and later copies of a weight several stages hold,
    `chain.steps.tied`: one weight counts once; each is the same summed gradient as the first copy,
    which the norm holds)."""
    with tf.name_scope("clip_global_norm"):
        sums = []
        for s, g in zip(stages, grads):
            with tf.device(s.device):
                own = squared_sum([None if (s.index, i) in later_copies else x for i, x in enumerate(g)])
            sums.append(own if s.device == device else copy_to(own, device, f"squared_sum_s{s.index}"))
        with tf.device(device):
            norm = tf.sqrt(tf.add_n(sums), name="global_norm")
            scale = factor(norm, clip)
        out, finite = [], []
        for s, g in zip(stages, grads):
            f = scale if s.device == device else copy_to(scale, s.device, f"clip_factor_s{s.index}")
            with tf.device(s.device):
                # x * f makes an embedding's sparse gradient dense, as Keras' clip_by_global_norm does
                out.append([None if x is None else x * tf.cast(f, x.dtype) for x in g])
                finite.append(tf.math.is_finite(f, name="finite"))
        return Clipped(out, norm, finite)
