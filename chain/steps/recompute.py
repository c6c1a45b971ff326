"""Activation recomputation (`pipeline.recompute`): a stage keeps only its input for a
microbatch and runs its forward pass again inside the backward.

In the compiled step a forward run under a `tf.GradientTape` keeps every intermediate tensor
its gradient will read until the backward consumes them: GPipe holds M microbatches' worth
on every stage, 1F1B up to K. A recomputed microbatch's forward runs without a tape (its
intermediates die with the forward); its backward runs the forward again under a tape, from
the saved input, and takes the gradient at once. Peak activation memory drops to the inputs
plus one microbatch's intermediates, for one more forward per microbatch (torchgpipe's
`checkpoint=never|except_last|always`; `except_last` keeps each round's last microbatch,
whose backward follows its forward soonest under 1F1B; chain's GPipe runs its backwards in
the forwards' order, so there it saves one replay per round and no more). The last stage
never pays the extra forward: `chain.pipeline.play` keeps its activations when its backward
follows its forward at once (1F1B), and otherwise runs its forward only once, in the backward
(its output feeds nothing but its own loss).

The replay must compute what the first forward computed: the same dropout masks and no
second update of batch-norm statistics. Keras 3 keeps both in the model's non-trainable
variables (a `SeedGenerator`'s state, advanced by every draw; moving means and variances),
so `snapshot` reads them before the first forward and `replay` sets them back for the
second one and restores their current values after it: the replay draws the same masks
and leaves no trace in the model's state. Randomness that lives outside the model's
variables (an unseeded `tf.random` op in a user's layer) is not replayed.
"""

from __future__ import annotations

from typing import Callable, Sequence, TypeVar

import keras
import tensorflow as tf

NEVER, EXCEPT_LAST, ALWAYS = "never", "except_last", "always"
T = TypeVar("T")


def recomputed(policy: str, microbatch: int, microbatches: int) -> bool:
    """Whether microbatch `microbatch` (numbered within its round, 0..M-1) is recomputed under `policy`."""
    if policy == NEVER:
        return False
    if policy == EXCEPT_LAST:
        return microbatch != microbatches - 1
    if policy == ALWAYS:
        return True
    raise ValueError(f"recompute policy {policy!r}: allowed {NEVER}, {EXCEPT_LAST}, {ALWAYS}")


def _state(model: keras.Model) -> list:
    """What a forward pass of `model` reads and changes besides its input: its non-trainable
    variables (dropout seed states, batch-norm statistics)."""
    return list(model.non_trainable_variables)


def snapshot(model: keras.Model) -> list[tf.Tensor]:
    """`model`'s state before a forward pass that will be replayed (call it just before)."""
    return [tf.identity(v.value) for v in _state(model)]


def replay(model: keras.Model, saved: Sequence[tf.Tensor], forward: Callable[[], T]) -> T:
    """`forward()` run with `model`'s state set back to `saved` (from `snapshot`), then the
    state as it was before this call: the same draws as the first run, no second update.

    Inside a `tf.function` the reads, assignments and the forward's own uses of these
    variables run in the order they are written here (automatic control dependencies order
    every op on one resource by trace order)."""
    variables = _state(model)
    now = [tf.identity(v.value) for v in variables]
    for v, value in zip(variables, saved):
        v.assign(value)
    result = forward()
    for v, value in zip(variables, now):
        v.assign(value)
    return result
