"""Weights several stages hold (a cut model's tied weights): their copies' gradients summed, the
step's side of the tie's rules (`chain.stages.tied_weights`: who holds, who borrows, which copies).

A model cut into stages whose later layer reuses an earlier layer's variable (a tied
embedding: the input Embedding's matrix as the read-out's projection) gets one copy of that
variable on every stage using it on another device (`Stage.shared`); the copies start
equal. On one device the variable's gradient is the sum of what its uses contribute, so
before the updates each copy's (unscaled) gradient crosses to the first holder's device, the
sum is taken there and sent back, and every stage applies that same sum with its own
optimizer, whose slots started equal too: every copy takes the identical update and the
copies stay identical. The global norm (`chain.steps.clipping`) counts the variable once.

When the later holder is on the first holder's device (zbv's last stage shares device 0 with the
first; `placement.devices` naming one device twice), it holds no copy: it reads the first holder's
variable (`Stage.borrowed`), and its backward adds its gradient to the first holder's sums
(`lend_back`), where the one optimizer applies it.

Copies of the pipeline (`placement.replicas=R`, `chain.pipeline.replicas`) hold the weight once per
holder in every copy: before the copies' gradients are averaged, each copy adds its holders' gradients
on its first holder's device (`gather_shared`), so the weight's gradient is averaged across the copies
once, not once per holder; `sum_shared` then sends that mean back to the later holders of each copy.
The mirrored fallback (`chain.strategies.mirrored`) sums the all-reduced gradients with `sum_shared`.

The numerics guard (`chain.steps.numerics`) judges each stage's update alone, so a stage whose
other gradients are not finite would skip while another holder applies the tied update, and the
copies would part. So every sum is NaN whenever any holder's gradients are not finite: every
holder then skips (on one device Keras skips the whole model's update).
"""

from __future__ import annotations

from typing import Sequence

import tensorflow as tf

from chain.stages.stage import Stage
from chain.stages.tied_weights import groups, owner_of
from chain.steps.numerics import all_finite
from chain.steps.ops import add_grads, copy_to


def lend_back(stages: Sequence[Stage], accumulated: list[list | None], k: int, grads: Sequence) -> list:
    """Stage k's gradients over its `gradient_variables` split in two: the `borrowed` weights' (a tied
    weight an earlier stage on the same device owns: one variable, `chain.stages.tied_weights`) added to the
    owner's running sums in `accumulated`, on that device; the rest, stage k's own, returned."""
    own = len(stages[k].trainable_variables)
    if not stages[k].borrowed:
        return list(grads)
    for b, g in zip(stages[k].borrowed, grads[own:], strict=True):
        if g is None:
            continue
        j, i = owner_of(stages, b.variable)
        sums = list(accumulated[j] or [None] * len(stages[j].trainable_variables))
        sums[i] = add_grads([sums[i]], [g])[0]
        accumulated[j] = sums
    return list(grads[:own])


def gather_shared(stages: Sequence[Stage], grads: Sequence[Sequence[tf.Tensor | None]]) -> list[list[tf.Tensor | None]]:
    """`grads` (per stage, in `trainable_variables` order) with each shared weight's gradients added on
    its first holder's device, in the first holder's place; the later holders' places None (`sum_shared`
    gives them the sum again, after the copies of the pipeline have averaged it once)."""
    out = [list(g) for g in grads]
    for n, group in enumerate(groups(stages).values()):
        parts = _on_first_holder(stages, out, group, f"gathered{n}")
        for k, i in group:
            out[k][i] = None
        if parts:
            k, i = group[0]
            with tf.device(stages[k].device):
                out[k][i] = tf.add_n(parts)
    return out


def _on_first_holder(
    stages: Sequence[Stage], grads: Sequence[Sequence[tf.Tensor | None]], group: Sequence[tuple[int, int]], name: str
) -> list[tf.Tensor]:
    """The group's gradients (None left out), dense, each copied to the first holder's device."""
    home = stages[group[0][0]].device
    parts = []
    for k, i in group:
        if grads[k][i] is None:
            continue
        with tf.device(stages[k].device):  # an embedding's gradient may be IndexedSlices
            g = tf.convert_to_tensor(grads[k][i])
        parts.append(g if stages[k].device == home else copy_to(g, home, f"{name}_s{k}"))
    return parts


def sum_shared(stages: Sequence[Stage], grads: Sequence[Sequence[tf.Tensor | None]]) -> list[list[tf.Tensor | None]]:
    """`grads` (per stage, in `trainable_variables` order) with every shared weight's copies given
    the sum of their gradients: summed on the first holder's device, the sum copied back."""
    out = [list(g) for g in grads]
    found = groups(stages)
    if not found:
        return out
    with tf.name_scope("shared_weights"):
        # One verdict for every holder of any tied weight (a stage may hold several, linking the
        # groups): all apply, or all skip. Each holder's own, on its device, before any sum.
        first = stages[next(iter(found.values()))[0][0]].device
        flags = []
        for k in sorted({k for group in found.values() for k, _ in group}):
            with tf.device(stages[k].device):
                ok = all_finite(None, grads[k])
            flags.append(ok if stages[k].device == first else copy_to(ok, first, f"shared_finite_s{k}"))
        with tf.device(first):
            all_ok = tf.reduce_all(tf.stack(flags))
        for n, group in enumerate(found.values()):
            home = stages[group[0][0]].device
            parts = _on_first_holder(stages, out, group, f"shared{n}")
            if not parts:
                continue
            ok = all_ok if home == first else copy_to(all_ok, home, f"shared{n}_finite")
            with tf.device(home):
                total = tf.add_n(parts)
                total = tf.where(ok, total, tf.fill(tf.shape(total), tf.constant(float("nan"), total.dtype)))
            for k, i in group:
                out[k][i] = (
                    total if stages[k].device == home else copy_to(total, stages[k].device, f"shared{n}_sum_s{k}")
                )
    return out
