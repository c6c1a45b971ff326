"""Inference through the chain, each stage on its device."""

from __future__ import annotations

from typing import Any, Sequence

import tensorflow as tf

from chain.stages.stage import Stage
from chain.steps.ops import copy_to


def forward(stages: Sequence[Stage], x: Any, chained: bool = True) -> dict[str, tf.Tensor]:
    """`body_k` is stage k's output and `head_k` its head's (mode=local); `chained=False`:
    every stage takes `x` (independent models, mode=side_by_side).

    Used for evaluation, and to compare a chain with its exports and with a re-staged copy of itself.
    """
    out = {}
    x = h = tf.nest.map_structure(tf.convert_to_tensor, x)  # a dict of a model's named inputs too
    for s in stages:
        h = copy_to(h if chained else x, s.device, f"stage_{s.index}")
        with tf.device(s.device):
            h = s.model(h, training=False)
            out[f"body_{s.index}"] = h
            if s.head is not None:
                out[f"head_{s.index}"] = s.head(h, training=False)
    return out
