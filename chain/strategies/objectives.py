"""What each mode learns: the objective half of a way of training, whatever the distribution.

An objective says which heads and read-out a mode's stages are built with (`heads`, `readout`,
`chained`, class attributes: `chain.state.remap` asks them through `objective(mode)` without
building anything) and, once the stages are built, what the step learns: the targets it reads,
where its report holds the losses, the read-outs evaluation scores, its per-stage and chain
fields of summary.json, and the objective's part of a mirrored replica's step. A strategy
(`chain.strategies.base.Strategy`, a distribution) holds one (`strategy.objective`); the table
of pairs is `chain.training.ways.TABLE`, and a test checks that each mode's pair uses this
module's objective for it.
"""

from __future__ import annotations

import functools
import math
from abc import ABC, abstractmethod
from dataclasses import dataclass, replace
from typing import Any, Callable, Sequence

import tensorflow as tf

from chain.config.schema import Settings
from chain.data.catalog import DataInfo
from chain.records.results import LossRecord, ReplicaLosses, StepResult
from chain.records.summaries import ChainFields, StageLosses, StageSummary, Summary
from chain.stages import losses
from chain.stages.stage import Stage
from chain.stages.tied_weights import later_copies
from chain.steps.clipping import clip_global
from chain.steps.evaluate import Readout
from chain.steps.replica import e2e_replica_step, local_replica_step
from chain.steps.report import ReportFormat
from chain.steps.update import shared_outcomes


@dataclass(frozen=True)
class Evaluation:
    """The chain on the whole validation set: `loss`, the one number a lower value of which is
    better (what `checkpoint.best` and early stopping follow); `stages`, each stage's metrics
    (mode=local; else empty); `chain`, the chain's (mode=e2e; else None). Metrics are means over
    the examples: `loss`, and `accuracy` (class labels) or `mae` (a value)."""

    loss: float
    stages: list[dict[str, float]]
    chain: dict[str, float] | None


class Objective(ABC):
    """What a way of training learns, over its built `stages` (see the module docstring)."""

    heads: bool = False  # each stage ends in a head of its own (a loss per stage)
    readout: bool = False  # the last stage ends in the chain's read-out (one loss after the chain)
    chained: bool = True  # stage k takes stage k-1's output (False: every stage takes the data)
    # The objective cuts each batch into pipeline.microbatches and normalizes per microbatch
    # (pipeline.batch_norm): a distribution that cannot says it ignores them.
    microbatched: bool = False
    title: str = ""  # its word in a way's name (`Strategy.way`: DevicePerStageLocal, MirroredChain, ...)

    def __init__(self, settings: Settings, info: DataInfo, stages: Sequence[Stage]):
        self.settings = settings
        self.info = info
        self.stages = list(stages)

    @abstractmethod
    def wanted_targets(self) -> list[str]:
        """The targets the step reads (each batch must hold them)."""

    @abstractmethod
    def default_target(self) -> str | None:
        """The target a bare `y` given to `Run.step` stands for (None: a bare y is ambiguous)."""

    @property
    @abstractmethod
    def report_format(self) -> ReportFormat:
        """Where the step's report holds its losses and guard flags (`chain.steps.report.ReportFormat`)."""

    @abstractmethod
    def read(self, row: Any) -> StepResult:
        """A step's report -> its loss, each stage's own loss ([] when stages have none) and the
        stages whose update the numerics guard dropped (before `chain.steps.numerics.judge`)."""

    @abstractmethod
    def report_values(self, flags: list, losses: ReplicaLosses, norm: Any = None) -> list[list]:
        """Each stage's values in the step's report, from its guard flag and the step's losses
        (each stage's own, or the chain's) and the global gradient norm (`optim.clip_global_norm`),
        laid out as `report_format` says."""

    @abstractmethod
    def readouts(self) -> list[Readout]:
        """The predictions evaluation scores (`chain.steps.evaluate.Readout`)."""

    @abstractmethod
    def evaluation(self, metrics: list[dict[str, float]]) -> Evaluation:
        """The read-outs' metrics as an `Evaluation`."""

    @abstractmethod
    def replica_step(self) -> Callable:
        """A mirrored replica's step for this objective: `fn((x, ys)) -> (losses, per-stage
        gradients)` (`chain.steps.replica`)."""

    def stage_summary(self, stage: Stage, entry: StageSummary, first: LossRecord, last: LossRecord) -> StageSummary:
        """`entry` (stage's in summary.json) with the objective's per-stage fields filled in, from
        the loss records of the first and last steps."""
        return entry

    def summary(self, summary: Summary) -> Summary:
        """`summary` with the objective's own fields of summary.json filled in."""
        return summary

    def outcomes(self, grads: list, total: ReplicaLosses) -> list:
        """Each stage's float16 loss-scale outcome after a mirrored step's all-reduce; None: each
        stage decides from its own loss."""
        return [None] * len(self.stages)

    def clip(self, grads: list) -> tuple[list, tf.Tensor | None]:
        """A mirrored step's summed gradients clipped by the chain's global norm, and that norm
        (None: the optimizers clip, if at all: each stage is a model of its own)."""
        return grads, None


class LocalObjective(Objective):
    """mode=local: every stage learns its own target through a head, with its own loss."""

    heads = True
    title = "Local"

    def wanted_targets(self) -> list[str]:
        return sorted({s.target.name for s in self.stages})

    def default_target(self) -> str | None:
        # A bare array is the data set's first target, when every stage learns that one.
        first = self.info.targets[0].name
        return first if self.wanted_targets() == [first] else None

    @functools.cached_property
    def report_format(self) -> ReportFormat:
        return ReportFormat.per_stage(len(self.stages))

    def read(self, row: Any) -> StepResult:
        losses, skipped = self.report_format.decode(row)
        return StepResult(float(sum(losses)), losses, skipped)  # the step's loss: the sum of the stages'

    def report_values(self, flags: list, losses: ReplicaLosses, norm: Any = None) -> list[list]:
        return [[losses.stages[s.index], f] for s, f in zip(self.stages, flags)]

    def stage_summary(self, stage: Stage, entry: StageSummary, first: LossRecord, last: LossRecord) -> StageSummary:
        own = StageLosses(stage.target.name, first.stage_losses[stage.index], last.stage_losses[stage.index])
        return replace(entry, own=own)

    def readouts(self) -> list[Readout]:
        return [
            Readout(f"head_{s.index}", s.device, s.target, losses.head_loss(s.target), (s.index,)) for s in self.stages
        ]

    def evaluation(self, metrics: list[dict[str, float]]) -> Evaluation:
        # Like the training loss, the validation loss is the sum of the stages' own losses.
        return Evaluation(sum(m["loss"] for m in metrics), metrics, None)

    def replica_step(self) -> Callable:
        t = self.settings.trainer
        return local_replica_step(self.stages, self.settings.examples_per_step, t.grad_accum, t.jit_compile)


class Independent(LocalObjective):
    """mode=side_by_side: independent models, each its own head and loss, each taking the data."""

    chained = False
    title = ""  # the distribution's name says it all: SideBySide


def token_metrics(loss: float) -> dict[str, float]:
    """What a per-token cross-entropy (nats per token, the mean over real tokens) is usually read as:
    `perplexity` (its exponential; inf past float range) and `bits_per_token` (it over ln 2)."""
    return {"perplexity": math.inf if loss > 709 else math.exp(loss), "bits_per_token": loss / math.log(2)}


class ChainObjective(Objective):
    """mode=e2e: the chain is one network; the last stage ends in a read-out, one loss after it."""

    readout = True
    microbatched = True
    title = "Chain"

    @property
    def target(self):
        return self.stages[-1].target

    @property
    def clip_global_norm(self) -> float | None:
        """`optim.clip_global_norm`: the chain's gradients are clipped by their global norm (the
        same on every stage, `chain.config.checks.check_clipping`), and each step reports it."""
        return self.settings.stages[-1].optim.clip_global_norm

    def loss_fn(self) -> Callable:
        """`fn(y, pred)`: the chain's mean loss (`loss=`, without the labels `ignore_class=` names)."""
        return losses.make(self.settings.loss, self.target, self.settings.ignore_class)

    def wanted_targets(self) -> list[str]:
        return [self.target.name]

    def default_target(self) -> str | None:
        return self.target.name  # one loss: a bare array is the chain's target

    @functools.cached_property
    def report_format(self) -> ReportFormat:
        return ReportFormat.chain(len(self.stages), norm=self.clip_global_norm is not None)

    def read(self, row: Any) -> StepResult:
        losses, skipped = self.report_format.decode(row)
        return StepResult(losses[0], [], skipped, self.report_format.grad_norm(row))  # no stage has a loss of its own

    def report_values(self, flags: list, losses: ReplicaLosses, norm: Any = None) -> list[list]:
        extra = [norm] if self.report_format.norm is not None else []
        return [[f] for f in flags[:-1]] + [[flags[-1], losses.chain[0], *extra]]

    def summary(self, summary: Summary) -> Summary:
        return replace(summary, chain=ChainFields(self.settings.loss, self.target.name))

    def readouts(self) -> list[Readout]:
        last = self.stages[-1]
        return [
            Readout(f"body_{last.index}", last.device, self.target, self.loss_fn(), tuple(s.index for s in self.stages))
        ]

    def evaluation(self, metrics: list[dict[str, float]]) -> Evaluation:
        (chain,) = metrics
        if self.settings.loss == "sparse_categorical_crossentropy" and (
            self.target.shape or self.settings.ignore_class is not None
        ):
            chain = {**chain, **token_metrics(chain["loss"])}
        return Evaluation(chain["loss"], [], chain)

    def replica_step(self) -> Callable:
        t = self.settings.trainer
        return e2e_replica_step(
            self.stages, self.settings.examples_per_step, self.loss_fn(), t.grad_accum, t.jit_compile
        )

    def outcomes(self, grads: list, total: ReplicaLosses) -> list:
        return shared_outcomes(self.stages, grads, total.chain[0], None)  # one decision for the chain

    def clip(self, grads: list) -> tuple[list, tf.Tensor | None]:
        if self.clip_global_norm is None:
            return grads, None
        clipped = clip_global(self.stages, grads, self.clip_global_norm, None, later_copies(self.stages))
        return clipped.grads, clipped.norm


OBJECTIVES: dict[str, type[Objective]] = {
    "local": LocalObjective,  # each stage its own head and loss
    "e2e": ChainObjective,  # one loss after the chain's read-out
    "side_by_side": Independent,  # independent models, each its own head, each taking the data
}


def objective(mode: str) -> type[Objective]:
    """The objective whose `heads`, `readout` and `chained` say what `mode`'s stages are built with."""
    return OBJECTIVES[mode]
