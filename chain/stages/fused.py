"""Optimizers whose update is TensorFlow's fused kernel (`optim.fused=true`).

Keras 3's Adam and SGD update a variable with one TensorFlow op per term of their formula
(Adam: twelve, each a pass over the variable that allocates its result); TensorFlow's training
ops (`ResourceApplyAdam`, `ResourceApplyKerasMomentum`, `ResourceApplyGradientDescent`) do the
same arithmetic in one pass. These subclasses replace only Keras' `update_step`, so everything
around it stays Keras' own: clipping, the iteration count, variable constraints, the slots
(checkpoints are the same), tf.distribute strategies.

The results: SGD (plain or with momentum) is the same arithmetic in the same order, bit for bit
(tests/test_fused.py). Adam is not: the kernel computes `1 - beta_1` and `1 - beta_2` in float32
from float32 betas (0.9f gives 0.100000024), where Keras rounds Python's `1 - 0.9` to float32
(0.1f), so the moments differ from Keras' in the last bits. Hence an option, off by default.
"""

from __future__ import annotations

import keras
import tensorflow as tf

from chain.internals.keras_private import adam_slots, variable_index


def _handle(variable) -> tf.Tensor:
    """The resource handle of a Keras variable (or of the tf.Variable Keras hands `update_step`)."""
    return (variable.value if isinstance(variable, keras.Variable) else variable).handle


def _fused_adam_update(optimizer: keras.optimizers.Adam, gradient, variable, learning_rate) -> None:
    """One variable's Adam update by `ResourceApplyAdam`."""
    dtype = variable.dtype
    step = tf.cast(optimizer.iterations + 1, dtype)
    m, v = adam_slots(optimizer, variable_index(optimizer, variable))
    tf.raw_ops.ResourceApplyAdam(
        var=_handle(variable), m=_handle(m), v=_handle(v),
        beta1_power=tf.pow(tf.cast(optimizer.beta_1, dtype), step),
        beta2_power=tf.pow(tf.cast(optimizer.beta_2, dtype), step),
        lr=tf.cast(learning_rate, dtype), beta1=tf.cast(optimizer.beta_1, dtype),
        beta2=tf.cast(optimizer.beta_2, dtype), epsilon=tf.cast(optimizer.epsilon, dtype),
        grad=tf.cast(gradient, dtype))


class _FusedAdamUpdate:
    """Adam's update by `ResourceApplyAdam`, for a subclass of Keras' Adam or AdamW.

    A sparse gradient (an embedding's `IndexedSlices`) is Keras' own update: TensorFlow has no
    sparse Adam kernel (`ResourceSparseApplyAdam` does not exist), and densifying it first would
    not be Keras' sparse update, which `model.fit` makes (docs/optimizers.md)."""

    def update_step(self, gradient, variable, learning_rate):
        # amsgrad is not what chain builds (`make_optimizer`); Keras' own update does it
        if self.amsgrad or isinstance(gradient, tf.IndexedSlices):
            return super().update_step(gradient, variable, learning_rate)
        _fused_adam_update(self, gradient, variable, learning_rate)


class FusedAdam(_FusedAdamUpdate, keras.optimizers.Adam):
    """`keras.optimizers.Adam` whose update is `ResourceApplyAdam` (one pass per variable)."""


class FusedAdamW(_FusedAdamUpdate, keras.optimizers.AdamW):
    """`keras.optimizers.AdamW` whose Adam update is `ResourceApplyAdam`. The decoupled decay is
    Keras' own (`var -= var x weight_decay x lr` for every variable, before their updates), so it
    is AdamW's arithmetic in AdamW's order; only the Adam part differs, as FusedAdam's does."""


class FusedSGD(keras.optimizers.SGD):
    """`keras.optimizers.SGD` whose update is `ResourceApplyKerasMomentum` (with momentum) or
    `ResourceApplyGradientDescent` (without): Keras' arithmetic, one pass per variable."""

    def update_step(self, gradient, variable, learning_rate):
        dtype = variable.dtype
        lr, grad = tf.cast(learning_rate, dtype), tf.cast(gradient, dtype)
        if self.momentum == 0:
            tf.raw_ops.ResourceApplyGradientDescent(var=_handle(variable), alpha=lr, delta=grad)
            return
        accum = self.momentums[variable_index(self, variable)]
        tf.raw_ops.ResourceApplyKerasMomentum(var=_handle(variable), accum=_handle(accum), lr=lr, grad=grad,
                                              momentum=tf.cast(self.momentum, dtype), use_nesterov=self.nesterov)


def kind(optimizer: keras.optimizers.Optimizer) -> str:
    """The Keras optimizer `optimizer` is (`SGD` for a `FusedSGD`): what checkpoints record and
    compare, so that a run may resume with `optim.fused` switched (the state is the same)."""
    return next(c.__name__ for c in type(optimizer).__mro__ if c.__module__.startswith("keras"))
