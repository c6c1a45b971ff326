"""Each stage's estimated peak memory while training: a typed record and the arithmetic behind it.

A stage's peak is the sum of what it keeps for the whole step and what the schedule makes it
hold at its busiest moment, all float32 (mixed precision keeps float32 weights; its float16
activations make this an over-estimate):

- weights, their gradient sums over the microbatches, and the optimizer's slots (Adam 2 per
  weight, SGD with momentum 1, plain SGD 0);
- the backward's working set: weight gradients of one microbatch before they are added to the
  sums (a pipeline's backward, not compiled, holds about one layer's at a time: its weight
  products run before the gradient goes on past the layer, `chain.pipeline.play.weights_first`;
  otherwise the whole stage's), and the gradient arriving at the stage's output;
- activations: every layer output of a microbatch (what its tape keeps), times the
  microbatches the schedule holds at once on that stage (`held`: GPipe M on every stage, 1F1B
  min(M, K-k) on stage k, zb1 and interleaved what their action lists hold, `held_counts` in
  `chain.schedule.schedules`); zb1 also holds, between each B and its W, the gradients at every
  layer's output (`output_gradients_held`). With `pipeline.recompute` (`except_last` or `always`) a stage
  keeps only its input per held microbatch, plus one microbatch's layer outputs (the
  microbatch being replayed, or except_last's kept one, whose backward follows at once);
- its input per held microbatch, when it lives in memory of its own: always on the first stage
  (with the whole batch, which it splits), and on later stages of a GPU, where the copy from
  the previous device is a buffer of its own; logical CPU devices share one allocator, and a
  copy between them is the sending stage's tensor itself, already counted there;
- on the last stage, the read-out's logits (counted among the layer outputs by the caller)
  and the labels of the batch.

Kept simple on purpose: temporaries inside a layer (a convolution's workspace, XLA's fused
buffers) and the allocator's rounding are not counted. `scripts/bench_pipeline_memory.py`
compares the sum with the measured peak (docs/benchmarks.md).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from chain.config.shapes import FLOAT_BYTES

NEVER = "never"


@dataclass(frozen=True)
class StageCost:
    """What a stage is made of, per example where it says so: its trainable parameters, the floats
    its layers output (what its tape keeps: every layer's output, the read-out's logits on the last
    stage), the floats of its input and of its output, and its largest layer's parameters."""

    params: int
    activations_per_example: int
    input_per_example: int
    output_per_example: int
    largest_layer: int


@dataclass(frozen=True)
class Footprint:
    """One stage's estimated peak memory, in bytes, and its parts (`total` is their sum)."""

    weights: int
    gradients: int  # the gradient sums over microbatches plus the backward's weight gradients not yet added
    optimizer: int
    activations: int  # layer outputs held (or, recomputed, one microbatch's) and the gradient at the output
    inputs: int  # the stage's inputs held (the whole batch on the first stage, the labels on the last)
    held: int  # microbatches whose activations (or inputs) the stage holds at once

    @property
    def total(self) -> int:
        """The estimated peak: every part added."""
        return self.weights + self.gradients + self.optimizer + self.activations + self.inputs


def estimate(
    cost: StageCost,
    *,
    slots: int,
    microbatch: int,
    held: int,
    recompute: str = NEVER,
    first: bool = False,
    last: bool = False,
    batch: int = 0,
    label_floats: int = 1,
    own_input: bool = True,
    output_gradients: int = 0,
    layer_by_layer: bool = False,
) -> Footprint:
    """A stage's `Footprint` (see the module's docstring).

    `slots`: optimizer floats per weight; `microbatch`: examples per microbatch; `held`: the
    microbatches the schedule holds at once on this stage; `recompute`: `pipeline.recompute`;
    `first`/`last`: the chain's first or last stage (the batch; the labels, `label_floats` per
    example); `batch`: examples per step on this stage; `own_input`: whether the stage's input
    is a buffer of its own (False for a later stage on a logical CPU device); `output_gradients`:
    the microbatches whose layer-output gradients a split schedule adds at its busiest moment
    (`schedules.output_gradients_held`), each as large as its layer outputs; `layer_by_layer`: the
    backward holds one layer's weight gradients at a time (a pipeline's, not compiled), else every one.
    """
    b = FLOAT_BYTES
    weights = cost.params * b
    working = (cost.largest_layer if layer_by_layer else cost.params) * b
    outputs = cost.activations_per_example * microbatch * b
    one_input = cost.input_per_example * microbatch * b
    kept_input = first or own_input or recompute != NEVER  # recomputed: the sender no longer keeps it
    if recompute == NEVER:
        activations = (held + output_gradients) * outputs
    else:
        activations = outputs  # one microbatch's outputs: replayed, or except_last's kept one
    activations += cost.output_per_example * microbatch * b  # the gradient arriving at the output
    inputs = held * one_input if kept_input else 0
    if first:
        inputs += cost.input_per_example * batch * b
    if last:
        inputs += label_floats * batch * b
    return Footprint(
        weights=weights,
        gradients=weights + working,
        optimizer=slots * weights,
        activations=activations,
        inputs=inputs,
        held=held,
    )


def estimates(
    costs: Sequence[StageCost | None],
    *,
    slots: Sequence[int],
    batch: int,
    microbatch: int,
    held: Sequence[int],
    recompute: str = NEVER,
    own_inputs: bool = True,
    label_floats: int = 1,
    chained: bool = True,
    output_gradients: Sequence[int] | None = None,
    layer_by_layer: bool = False,
) -> list[Footprint | None]:
    """Every stage's `Footprint` (None where its cost is unknown before it is built): `held[k]`
    microbatches of `microbatch` examples on stage k (a step's `batch` cut as `chain.config.checks.BatchCut`
    says), `slots[k]` optimizer floats per weight, `output_gradients[k]` more microbatches' layer-output
    gradients (a split schedule; None: none).
    `chained=False` (mode=side_by_side): every stage takes the batch and has its labels;
    `layer_by_layer`: see `estimate`."""
    n = len(costs)
    extra = output_gradients or [0] * n
    return [
        None
        if c is None
        else estimate(
            c,
            slots=slots[k],
            microbatch=microbatch,
            held=held[k],
            recompute=recompute,
            first=k == 0 or not chained,
            last=k == n - 1 or not chained,
            batch=batch,
            label_floats=label_floats,
            own_input=own_inputs,
            output_gradients=extra[k],
            layer_by_layer=layer_by_layer,
        )
        for k, c in enumerate(costs)
    ]


def layer_costs(
    params: Sequence[int],
    outputs: Sequence[int],
    held: Sequence[int],
    *,
    slots: int,
    microbatch: int,
    recompute: str = NEVER,
) -> list[list[float]]:
    """Per stage k, per layer i: the bytes layer i adds to stage k's peak if stage k holds it
    (`placement.balance=memory`, `chain.planning.balance.partition`): its weights, gradients and
    slots, and its output per example times the microbatches stage k holds (recomputed: once).
    Additive per layer, so a stage's input and the read-out are left out of the split's search."""
    b = FLOAT_BYTES
    rows = []
    for h in held:
        times = h if recompute == NEVER else 1
        rows.append([float(p * b * (3 + slots) + o * microbatch * b * times) for p, o in zip(params, outputs)])
    return rows
