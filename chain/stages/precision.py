"""Precision: the Keras dtype policy each stage computes in (`precision=`).

- `float32`: everything in float32 (the default).
- `mixed_bfloat16`: the layers of every stage's body compute in bfloat16; their
  variables stay float32 (Keras' mixed policy casts each weight when the layer runs,
  and its gradient back to float32), so optimizers update float32 weights.
- `mixed_float16`: the same in float16, whose narrow exponent range needs loss scaling
  (`chain.stages.loss_scale`); bfloat16 has float32's exponent range and needs none.

The policy is passed to each layer when its stage is built, never set globally with
`keras.config.set_dtype_policy`: a global policy would leak into every model the
process builds later (a second run, a reference model in a test). Read-out layers (the
e2e chain's final logits or value, mode=local's heads) stay float32, and so does every
loss: they are tiny, and logits rounded to bfloat16's 8-bit mantissa would move the
cross-entropy by far more than the body's rounding does.
"""

from __future__ import annotations

import keras

from chain.config.schema import PRECISIONS as NAMES

FLOAT32 = "float32"
MIXED_FLOAT16 = "mixed_float16"


def body_policy(precision: str) -> keras.DTypePolicy:
    """The dtype policy of a stage's body layers under `precision` (one of `NAMES`)."""
    if precision not in NAMES:
        raise ValueError(f"precision {precision!r} is not known; allowed: {', '.join(NAMES)}")
    return keras.DTypePolicy(precision)


def readout_policy() -> keras.DTypePolicy:
    """The dtype policy of read-out layers (logits or a value): always float32."""
    return keras.DTypePolicy(FLOAT32)


def needs_loss_scale(precision: str) -> bool:
    """True when gradients computed in `precision` need loss scaling (float16 only)."""
    return precision == MIXED_FLOAT16
