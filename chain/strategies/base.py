"""What every way of training provides, in two halves that a strategy combines.

A *distribution* says where the stages live and how one batch becomes one update
(`Pipelined`: each stage on its device; `Mirrored`: every stage on every replica). An
*objective* says what is learned (`LocalObjective`: each stage its own head and loss;
`ChainObjective`: the chain is one network with one loss). A strategy is one of each
(`chain.strategies.TABLE`); `chain.training.Run` drives any of them through this
interface and never asks which one it has.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Sequence

import tensorflow as tf

from chain.config.schema import Settings
from chain.data.catalog import DataInfo
from chain.planning.planner import Placement
from chain.stages import losses
from chain.stages.build import build_stages
from chain.stages.stage import Stage
from chain.steps.evaluate import Readout, evaluation


@dataclass(frozen=True)
class Evaluation:
    """The chain on the whole validation set: `loss`, the one number a lower value of which is
    better (what `checkpoint.best` and early stopping follow); `stages`, each stage's metrics
    (mode=local; else empty); `chain`, the chain's (mode=e2e; else None). Metrics are means over
    the examples: `loss`, and `accuracy` (class labels) or `mae` (a value)."""

    loss: float
    stages: list[dict[str, float]]
    chain: dict[str, float] | None


class Strategy:
    """One way of training: builds the stages, compiles the step, runs it on whole batches.

    Subclasses set `heads`/`readout` (what the stages are built with), implement
    `make_step`, and may override the hooks below. `schedule` is the pipeline schedule
    (None when the strategy has none).
    """

    heads: bool = False
    readout: bool = False
    schedule = None

    def __init__(self, settings: Settings, placement: Placement, info: DataInfo):
        self.settings = settings
        self.placement = placement
        self.info = info
        self.stages: list[Stage] = self.build_stages()
        self.step_fn: Callable = self.make_step()
        self.eval_fn: Callable | None = None  # compiled on the first evaluation

    # --- distribution: where the stages live and how a batch becomes an update --------------

    def devices(self) -> Sequence[str | None]:
        """Each stage's device (None: the strategy's own scope places it)."""
        return self.placement.devices

    def build_stages(self) -> list[Stage]:
        """Every stage built on its device (`chain.stages.build`)."""
        s = self.settings
        return build_stages(s.stages, self.devices(), self.info, heads=self.heads, readout=self.readout,
                            precision_name=s.precision, initial_loss_scale=s.trainer.initial_loss_scale)

    def make_step(self) -> Callable:
        """The compiled step: `fn(*self.arguments(x, ys))` trains one batch."""
        raise NotImplementedError

    def arguments(self, x: tf.Tensor, ys: dict[str, tf.Tensor]) -> tuple:
        """What the compiled step takes for one whole batch."""
        return x, ys

    def call(self, x: tf.Tensor, ys: dict[str, tf.Tensor]) -> dict[str, tf.Tensor]:
        """Train one whole batch (already checked); returns the step's loss tensors."""
        return self.step_fn(*self.arguments(x, ys))

    def trace(self, x: tf.Tensor, ys: dict[str, tf.Tensor]):
        """The compiled step's concrete function for this batch's shapes (its graph, for audits)."""
        return self.step_fn.get_concrete_function(*self.arguments(x, ys))

    def batch_divisor(self) -> int:
        """A whole batch's size must be a multiple of this (its chunks, microbatches, replicas)."""
        return self.settings.trainer.grad_accum

    def check_batch(self, n: int) -> None:
        """ValueError unless a batch of `n` examples cuts into what the step needs, described whole."""
        d = self.batch_divisor()
        if n % d:
            raise ValueError(f"a batch of {n} examples does not cut into {self.cut_description()}; "
                             f"pass x and y with a multiple of {d} examples")

    def cut_description(self) -> str:
        return f"trainer.grad_accum={self.settings.trainer.grad_accum} equal chunks"

    def memory_devices(self) -> list[str]:
        """The devices whose peak memory the run reports."""
        return [s.device for s in self.stages]

    def summary(self) -> dict[str, Any]:
        """The strategy's own fields of summary.json."""
        return {}

    def plan_text(self, full: bool) -> str | None:
        """What the run prints about its plan beyond the placement table (e.g. the schedule)."""
        return None

    def make_eval(self) -> Callable:
        """The compiled evaluation: `fn(dataset)` -> each read-out's metrics (`chain.steps.evaluate`).

        Each stage's forward pass runs where the stage lives: on its device (pipelined), or
        in cross-replica context over the mirrored variables (every replica holds the same).
        """
        return evaluation(self.stages, self.readouts())

    def evaluate(self, dataset: tf.data.Dataset) -> Evaluation:
        """The chain on every batch of `dataset` (the validation set)."""
        if self.eval_fn is None:
            self.eval_fn = self.make_eval()
        return self.evaluation(self.eval_fn(dataset))

    # --- objective: what the chain learns ----------------------------------------------------

    def wanted_targets(self) -> list[str]:
        """The targets the step reads (each batch must hold them)."""
        raise NotImplementedError

    def default_target(self) -> str | None:
        """The target a bare `y` given to `Run.step` stands for (None: a bare y is ambiguous)."""
        raise NotImplementedError

    def losses(self, out: dict[str, Any]) -> tuple[float, list[float]]:
        """(the step's loss, each stage's own loss or [] when stages have none) as floats."""
        raise NotImplementedError

    def stage_summary(self, stage: Stage, first: dict, last: dict) -> dict[str, Any]:
        """The objective's per-stage fields of summary.json."""
        return {}

    def readouts(self) -> list[Readout]:
        """The predictions evaluation scores (`chain.steps.evaluate.Readout`)."""
        raise NotImplementedError

    def evaluation(self, metrics: list[dict[str, float]]) -> Evaluation:
        """The read-outs' metrics as an `Evaluation`."""
        raise NotImplementedError


class LocalObjective(Strategy):
    """mode=local: every stage learns its own target through a head, with its own loss."""

    heads = True

    def wanted_targets(self) -> list[str]:
        return sorted({s.target.name for s in self.stages})

    def default_target(self) -> str | None:
        # A bare array is the data set's first target, when every stage learns that one.
        first = self.info.targets[0].name
        return first if self.wanted_targets() == [first] else None

    def losses(self, out: dict[str, Any]) -> tuple[float, list[float]]:
        per_stage = [float(out[f"stage_{s.index}"]) for s in self.stages]
        return float(sum(per_stage)), per_stage

    def stage_summary(self, stage: Stage, first: dict, last: dict) -> dict[str, Any]:
        return {"target": stage.target.name, "loss_first": first["stage_losses"][stage.index],
                "loss_last": last["stage_losses"][stage.index]}

    def readouts(self) -> list[Readout]:
        return [Readout(f"head_{s.index}", s.device, s.target, losses.head_loss(s.target)) for s in self.stages]

    def evaluation(self, metrics: list[dict[str, float]]) -> Evaluation:
        # Like the training loss, the validation loss is the sum of the stages' own losses.
        return Evaluation(sum(m["loss"] for m in metrics), metrics, None)


class ChainObjective(Strategy):
    """mode=e2e: the chain is one network; the last stage ends in a read-out, one loss after it."""

    readout = True

    @property
    def target(self):
        return self.stages[-1].target

    def loss_fn(self) -> Callable:
        """`fn(y, pred)`: the chain's mean loss (`loss=`)."""
        return losses.make(self.settings.loss, self.target)

    def wanted_targets(self) -> list[str]:
        return [self.target.name]

    def default_target(self) -> str | None:
        return self.target.name  # one loss: a bare array is the chain's target

    def losses(self, out: dict[str, Any]) -> tuple[float, list[float]]:
        return float(out["loss"]), []

    def summary(self) -> dict[str, Any]:
        return {"loss_fn": self.settings.loss, "target": self.target.name, **super().summary()}

    def readouts(self) -> list[Readout]:
        last = self.stages[-1]
        return [Readout(f"body_{last.index}", last.device, self.target, self.loss_fn())]

    def evaluation(self, metrics: list[dict[str, float]]) -> Evaluation:
        (chain,) = metrics
        return Evaluation(chain["loss"], [], chain)
