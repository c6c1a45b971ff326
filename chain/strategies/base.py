"""What every way of training provides, in two halves that a strategy combines.

A *distribution* says where the stages live and how one batch becomes one update
(`Pipelined`: each stage on its device; `Mirrored`: every stage on every replica). An
*objective* says what is learned (`LocalObjective`: each stage its own head and loss;
`ChainObjective`: the chain is one network with one loss). A strategy is one of each
(`chain.strategies.TABLE`); `chain.training.Run` drives any of them through this
interface and never asks which one it has.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import tensorflow as tf

from chain.config.schema import Settings
from chain.data.catalog import DataInfo
from chain.planning.planner import Placement
from chain.stages import losses
from chain.stages.build import build_stages
from chain.stages.stage import Stage


class Strategy:
    """One way of training: builds the stages, compiles the step, runs it on whole batches.

    Subclasses set `heads`/`readout` (what the stages are built with), implement
    `make_step`, and may override the hooks below. `schedule` is the pipeline schedule
    (None when the strategy has none).
    """

    heads: bool = False
    readout: bool = False
    schedule = None

    def __init__(self, settings: Settings, placement: Placement, info: DataInfo, bodies: Sequence | None = None,
                 labels: Sequence[str | None] | None = None):
        self.settings = settings
        self.placement = placement
        self.info = info
        self.bodies, self.labels = bodies, labels  # stage bodies not from the config (chain.stages.bodies)
        self.stages: list[Stage] = self.build_stages()
        self.step_fn: Callable = self.make_step()

    # --- distribution: where the stages live and how a batch becomes an update --------------

    def devices(self) -> Sequence[str | None]:
        """Each stage's device (None: the strategy's own scope places it)."""
        return self.placement.devices

    def build_stages(self) -> list[Stage]:
        """Every stage built on its device (`chain.stages.build`)."""
        s = self.settings
        return build_stages(s.stages, self.devices(), self.info, heads=self.heads, readout=self.readout,
                            precision_name=s.precision, initial_loss_scale=s.trainer.initial_loss_scale,
                            bodies=self.bodies, labels=self.labels)

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
