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
(0.1f), so the moments differ from Keras' in the last bits. Both are the default all the same
(`conf/optim/*.yaml`): chain's promise is that pipelining does not change the math, which its
equality tests check against one device through the same kernel, not Keras' Adam bit for bit;
and the fused update is what makes the default as fast as Keras' own `model.fit`
(docs/benchmarks.md). `optim.fused=false` gives Keras' own update.
"""

from __future__ import annotations

import keras
import tensorflow as tf

from chain.internals.keras_private import adam_slots, variable_index


def _handle(variable) -> tf.Tensor:
    """The resource handle of a Keras variable (or of the tf.Variable Keras hands `update_step`)."""
    return (variable.value if isinstance(variable, keras.Variable) else variable).handle


# The scalars of the update being traced, per optimizer (by id) and (dtype, device): `apply` opens
# the entry and drops it. Not an attribute: Keras and TensorFlow track an optimizer's attributes.
_SCALARS: dict[int, dict[tuple, dict[str, tf.Tensor]]] = {}


class _FusedAdamUpdate:
    """Adam's update by `ResourceApplyAdam`, for a subclass of Keras' Adam or AdamW.

    A sparse gradient (an embedding's `IndexedSlices`) is Keras' own update: TensorFlow has no
    sparse Adam kernel (`ResourceSparseApplyAdam` does not exist), and densifying it first would
    not be Keras' sparse update, which `model.fit` makes (docs/optimizers.md).

    The kernel's scalars (the betas' powers at this step, the learning rate, the betas and epsilon
    in the variable's dtype) are the same for every variable of one update: they are computed once
    per update (and dtype and device), not once per variable, which was two `Pow`s, five `Cast`s
    and a read of the iteration count per variable, each an op the executor schedules."""

    def apply(self, grads, trainable_variables=None):
        _SCALARS[id(self)] = {}
        try:
            return super().apply(grads, trainable_variables)
        finally:
            _SCALARS.pop(id(self), None)

    def _scalars(self, dtype: tf.DType, device: str, learning_rate) -> dict[str, tf.Tensor]:
        """The kernel's scalars for a variable of `dtype` on `device`: this update's, made once."""
        memo = _SCALARS.get(id(self))  # None: `update_step` called outside `apply`
        key = (dtype, device)
        if memo is not None and key in memo:
            return memo[key]
        step = tf.cast(self.iterations + 1, dtype)
        beta_1, beta_2 = tf.cast(self.beta_1, dtype), tf.cast(self.beta_2, dtype)
        out = {
            "beta1_power": tf.pow(beta_1, step),
            "beta2_power": tf.pow(beta_2, step),
            "lr": tf.cast(learning_rate, dtype),
            "beta1": beta_1,
            "beta2": beta_2,
            "epsilon": tf.cast(self.epsilon, dtype),
        }
        if memo is not None:
            memo[key] = out
        return out

    def update_step(self, gradient, variable, learning_rate):
        # amsgrad is not what chain builds (`make_optimizer`); Keras' own update does it
        if self.amsgrad or isinstance(gradient, tf.IndexedSlices):
            return super().update_step(gradient, variable, learning_rate)
        dtype = variable.dtype
        m, v = adam_slots(self, variable_index(self, variable))
        tf.raw_ops.ResourceApplyAdam(
            var=_handle(variable),
            m=_handle(m),
            v=_handle(v),
            grad=tf.cast(gradient, dtype),
            **self._scalars(dtype, _handle(variable).device, learning_rate),
        )


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
        tf.raw_ops.ResourceApplyKerasMomentum(
            var=_handle(variable),
            accum=_handle(accum),
            lr=lr,
            grad=grad,
            momentum=tf.cast(self.momentum, dtype),
            use_nesterov=self.nesterov,
        )


def kind(optimizer: keras.optimizers.Optimizer) -> str:
    """The Keras optimizer `optimizer` is (`SGD` for a `FusedSGD`): what checkpoints record and
    compare, so that a run may resume with `optim.fused` switched (the state is the same)."""
    return next(c.__name__ for c in type(optimizer).__mro__ if c.__module__.startswith("keras"))
