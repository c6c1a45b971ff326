"""Dynamic loss scaling for `precision=mixed_float16`.

float16 gradients below ~6e-8 flush to zero. Multiplying the loss by a large scale S
inside the tape lifts every gradient by S; dividing the gradients by S before the
update gives the true gradients back. Too large an S overflows to Inf: that step is
skipped and S halved; after `growth_steps` finite steps in a row S doubles. S is a
power of two (the schema insists on it), so scaling and unscaling are exact.

Why not Keras' `LossScaleOptimizer` (`scale_loss` in the tape, `apply` unscales and
skips): its `apply` decides from one optimizer's gradients alone, but in mode=e2e one
scaled loss produces every stage's gradients, so every stage must unscale by the same
S and all must skip together when any of them overflows; its skip is invisible to the
numerics guard, which would first call the overflow a NaN; and it must be applied in
replica context, while mirrored runs apply updates in cross-replica context.

Design. Every float16 stage holds a `LossScale` (created on its device, saved in its
checkpoint). A *group* of stages shares one loss: in mode=local each stage is its own
group; in mode=e2e the whole chain is one group. Each step the group takes one
`decide` outcome, computed from the group's loss and every member's finite flag (in
e2e on the last stage's device, like Megatron-LM's found-inf reduction over pipeline
stages), and every member applies it to its own `LossScale`. The members' scales start
equal and always take the same outcome, so they stay equal: the last stage's scale
multiplies the loss, each stage divides its gradients by its own copy of the same
number, and no stage reads a variable on another device.

Outcomes:

    FINITE     loss and every gradient finite: each stage's update is applied;
               the scale grows after `growth_steps` such steps in a row.
    OVERFLOW   the loss is finite but a gradient is not, and S > MIN_SCALE: every
               update of the group is skipped and S halves. A normal event of float16
               training, so the numerics guard does not count it (trainer.on_nan=stop
               does not stop); `overflows` counts it.
    NONFINITE  the loss itself is not finite, or gradients overflow even at S = 1
               (no scale could help): the numerics guard judges each stage as it does
               without loss scaling; S stays.
"""

from __future__ import annotations

from typing import Callable, Sequence

import tensorflow as tf

FINITE, OVERFLOW, NONFINITE = 0, 1, 2
INITIAL_SCALE = 2.0**15  # Keras' LossScaleOptimizer default
GROWTH_STEPS = 2000  # likewise
MIN_SCALE = 1.0


class LossScale(tf.Module):
    """One stage's copy of a dynamic loss scale: `scale`, `good_steps` (finite steps since the
    last change) and `overflows` (steps skipped for overflow), all saved in checkpoints."""

    def __init__(self, initial: float = INITIAL_SCALE, growth_steps: int = GROWTH_STEPS, name: str = "loss_scale"):
        super().__init__(name=name)
        self.growth_steps = growth_steps
        self.scale = tf.Variable(float(initial), dtype=tf.float32, trainable=False, name="scale")
        self.good_steps = tf.Variable(0, dtype=tf.int64, trainable=False, name="good_steps")
        self.overflows = tf.Variable(0, dtype=tf.int64, trainable=False, name="overflows")

    def scale_loss(self, loss: tf.Tensor) -> tf.Tensor:
        """`loss` times the scale: what the tape differentiates."""
        return loss * tf.cast(self.scale, loss.dtype)

    def unscale(self, grads: Sequence[tf.Tensor | None]) -> list[tf.Tensor | None]:
        """Gradients of a scaled loss divided by the scale (exact: it is a power of two)."""
        return [None if g is None else on_values(lambda v: v / tf.cast(self.scale, v.dtype), g) for g in grads]

    def update(self, outcome: tf.Tensor, guarded: Callable[[], tf.Tensor]) -> tf.Tensor:
        """Act on this step's `outcome` (see the module doc); `guarded()` applies the update
        through the numerics guard and returns whether the guard dropped it. Returns that
        flag: False on an overflow, which this scale skips and counts itself."""

        def overflow() -> tf.Tensor:
            self.scale.assign(tf.maximum(self.scale * 0.5, MIN_SCALE))
            self.good_steps.assign(0)
            self.overflows.assign_add(1)
            return tf.constant(False)

        def otherwise() -> tf.Tensor:
            dropped = guarded()
            tf.cond(tf.equal(outcome, FINITE), self._grow, lambda: None)
            return dropped

        return tf.cond(tf.equal(outcome, OVERFLOW), overflow, otherwise)

    def _grow(self) -> None:
        def double() -> None:
            self.scale.assign(self.scale * 2.0)
            self.good_steps.assign(0)

        def count() -> None:
            self.good_steps.assign_add(1)

        # Read before writing (as Keras does): the predicate must not depend on the assign.
        tf.cond(self.good_steps + 1 >= self.growth_steps, double, count)


def loss_finite(loss: tf.Tensor | None) -> tf.Tensor:
    """A scalar bool: `loss` holds only finite numbers (True without a loss)."""
    return tf.constant(True) if loss is None else tf.reduce_all(tf.math.is_finite(loss))


def decide(loss: tf.Tensor | None, finite: Sequence[tf.Tensor], scale: tf.Tensor) -> tf.Tensor:
    """The group's outcome (FINITE, OVERFLOW or NONFINITE, int32) from its loss, each member's
    all-gradients-finite flag and the (shared) scale."""
    return outcome_of(loss_finite(loss), finite, scale)


def outcome_of(loss_ok: tf.Tensor, finite: Sequence[tf.Tensor], scale: tf.Tensor) -> tf.Tensor:
    """`decide` from the loss's finite flag already computed (`loss_finite`)."""
    grads_ok = tf.reduce_all(tf.stack(list(finite)))
    overflow = tf.logical_and(loss_ok, scale > MIN_SCALE)
    return tf.where(tf.logical_and(loss_ok, grads_ok), FINITE, tf.where(overflow, OVERFLOW, NONFINITE))


def on_values(fn: Callable[[tf.Tensor], tf.Tensor], gradient):
    """`fn(gradient)` for an elementwise `fn` (a scaling); an embedding's sparse gradient
    (IndexedSlices) stays sparse, `fn` applied to its rows, so the optimizer still makes Keras'
    sparse update of it (TensorFlow's operators would densify it)."""
    if isinstance(gradient, tf.IndexedSlices):
        return tf.IndexedSlices(fn(gradient.values), gradient.indices, gradient.dense_shape)
    return fn(gradient)
