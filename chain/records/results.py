"""A step's result, the loss records a checkpoint keeps, and a mirrored replica's losses."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple

from chain.records.serial import item


@dataclass(frozen=True)
class StepResult:
    """One optimizer step, as the host reads it from the step's report (`Strategy.read`)."""

    loss: float = item("the step's loss: mode=local the sum of the stages' own losses, mode=e2e the chain's")
    stage_losses: list[float] = item("each stage's own loss (mode=local; empty in mode=e2e: no stage has one)")
    skipped: list[int] = item("the stages whose update the numerics guard dropped in this step")
    grad_norm: float | None = item(
        "optim.clip_global_norm (mode=e2e): the global gradient norm before clipping", default=None, omit_none=True
    )


@dataclass(frozen=True)
class LossRecord:
    """One step's losses as a checkpoint and summary.json keep them (NaN and Inf as null)."""

    loss: float | None = item("the step's loss (null: not finite, or not meaningful after a restage)")
    stage_losses: list[float | None] = item("each stage's own loss (mode=local; else empty)")
    grad_norm: float | None = item(
        "optim.clip_global_norm (mode=e2e): the global gradient norm before clipping (null: not finite)",
        default=None,
        omit_none=True,
    )


@dataclass(frozen=True)
class LossHistory:
    """The loss records a checkpoint (and `checkpoint.json`) keeps beside its state."""

    loss_first: LossRecord | None = item("the losses of step 1 (kept across resumes)")
    loss_last: LossRecord | None = item("the losses of the checkpoint's step")


class ReplicaLosses(NamedTuple):
    """One replica's losses in a mirrored step (tensors, each scaled by the replica's share of the
    global batch), which the mirrored step sums over the replicas field by field.

    `stages[k]`: stage k's own loss (mode=local; else empty). `chain`: the chain's loss as a
    one-element tuple (mode=e2e; else empty): an empty tuple, not None, so that `tf.nest` and the
    tf.distribute strategy map over it. A NamedTuple, not a dataclass: `tf.nest` walks NamedTuples.
    """

    stages: tuple[Any, ...] = ()
    chain: tuple[Any, ...] = ()
