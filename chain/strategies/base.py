"""What every way of training provides, in two halves that a strategy combines.

A *distribution* says where the stages live and how one batch becomes one update
(`Pipelined`: each stage on its device; `Mirrored`: every stage on every replica). An
*objective* says what is learned (`LocalObjective`: each stage its own head and loss;
`ChainObjective`: the chain is one network with one loss). A strategy is one of each
(`chain.training.ways.TABLE`); `chain.training.run.Run` drives any of them through this
interface and never asks which one it has.
"""

from __future__ import annotations

import functools
import math
import time
from dataclasses import dataclass, replace
from typing import Any, Callable, Sequence

import numpy as np
import tensorflow as tf

from chain.config.schema import Settings
from chain.errors import ConfigError
from chain.data.catalog import DataInfo
from chain.data.stream_shares import StreamShares
from chain.planning.planner import Placement
from chain.records.results import LossRecord, ReplicaLosses, StepResult
from chain.records.summaries import ChainFields, StageLosses, StageSummary, Summary
from chain.stages import losses
from chain.stages.assemble import build_stages
from chain.stages.stage import Stage
from chain.steps import tied
from chain.steps.report import Layout, Reports
from chain.steps.evaluate import Readout, evaluation


def _refuse_added_losses(stage: Stage, parts: str) -> None:
    """ConfigError if `stage`'s model adds `add_loss` terms (`losses.added_losses`): computed on
    parts of a batch they need not add up to the whole batch's, which Keras' `fit` minimizes."""
    with tf.device(stage.device):
        n = losses.added_losses(stage.model)
    if n:
        raise ConfigError(f"stage {stage.index} ({stage.describe()}) adds {n} loss term(s) with add_loss, and {parts} "
                          "would compute them on parts of each batch, which equals the whole batch's term only for a "
                          "mean over examples: use pipeline.microbatches=1 and trainer.grad_accum=1, or an "
                          "activity_regularizer (Keras averages those over the batch)")


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
    `make_step` (a traceable step returning the step's report, `chain.steps.report`), and
    may override the hooks below. `schedule` is the pipeline schedule (None when the
    strategy has none).
    """

    heads: bool = False
    readout: bool = False
    chained: bool = True  # stage k takes stage k-1's output (False: every stage takes the data)
    steps_in_one_call: bool = True  # False: `call_many` calls one step at a time (`_call_each`)
    schedule = None
    progress = None  # a pipeline step's markers (`trainer.stall_s`: `position`, `waiting`)
    shared_weights: bool = False  # True: its step sums the gradients of a weight several stages hold

    def __init__(self, settings: Settings, placement: Placement, info: DataInfo, bodies: Sequence | None = None,
                 labels: Sequence[str | None] | None = None):
        self.settings = settings
        self.placement = placement
        self.info = info
        self.bodies, self.labels = bodies, labels  # stage bodies not from the config (chain.stages.bodies)
        self.stages: list[Stage] = self.build_stages()
        self.set_step(self.make_step())
        self.eval_fn: Callable | None = None  # compiled on the first evaluation

    # --- distribution: where the stages live and how a batch becomes an update --------------

    def devices(self) -> Sequence[str | None]:
        """Each stage's device (None: the strategy's own scope places it)."""
        return self.placement.devices

    def build_stages(self) -> list[Stage]:
        """Every stage built on its device (`chain.stages.assemble`); a user's model with `add_loss`
        terms is refused when a device computes its loss on parts of a batch (`parts`)."""
        s = self.settings
        stages = build_stages(s.stages, self.devices(), self.info, heads=self.heads, readout=self.readout,
                              precision_name=s.precision, initial_loss_scale=s.trainer.initial_loss_scale,
                              bodies=self.bodies, labels=self.labels, chained=self.chained, seed=s.seed)
        self._refuse_shared_weights(stages)
        parts = self.parts()
        if parts is not None:
            for stage, body in zip(stages, self.bodies or [None] * len(stages)):
                if body is not None:  # the chain's own bodies add no losses
                    _refuse_added_losses(stage, parts)
        with_terms = [str(st.index) for st in stages if losses.regularized(st.model, st.head)]
        if with_terms:
            self.placement = self.placement.noted(  # a new record: the one planned is never changed
                f"the loss of stage(s) {', '.join(with_terms)} includes their regularizers "
                "(model.losses), as Keras' fit: the logged loss is the loss plus these terms")
        return stages

    def _refuse_shared_weights(self, stages: Sequence[Stage]) -> None:
        """A ConfigError if two stages hold copies of one weight (a cut model's tied weight) and this
        strategy's step does not sum their gradients (only mode=e2e's pipeline step does)."""
        found = tied.groups(stages)
        if found and not self.shared_weights:
            name, copies = next(iter(found.items()))
            (a, _), (b, _) = copies[:2]
            raise ConfigError(f"stages {a} and {b} both use the weight {name!r} (a tied weight of the cut model); only "
                              f"mode=e2e with one pipeline (a device per stage, placement.replicas=1) sums its copies' "
                              f"gradients, not {type(self).__name__}: use mode=e2e, or cut the model so one stage "
                              "holds every layer using it")

    def parts(self) -> str | None:
        """How a device splits a batch to compute a stage's loss (its chunks), or None when it
        computes it on its whole share at once. (Replicas do not count: Keras itself computes
        `model.losses` per replica.)"""
        n = self.settings.trainer.grad_accum
        return f"trainer.grad_accum={n} equal chunks" if n > 1 else None

    def make_step(self) -> Callable:
        """The step, traceable: `fn(*self.arguments(x, ys)) -> report` trains one batch."""
        raise NotImplementedError

    def set_step(self, body: Callable) -> None:
        """Use `body` (traceable: one step, inside `repeat`'s loop too) as the step, dropping every
        trace and compiled loop made from the one before."""
        self.body = body
        # autograph=False: the steps' Python control flow is over Python values (unrolled on purpose),
        # and Keras 3 traces its own train step unconverted too (do_not_convert), so user layers see
        # what they see in model.fit; converting cost about 2 s of CPU per process.
        self.step_fn = tf.function(body, autograph=False)
        self._concrete: dict[tuple, Any] = {}  # argument shapes and dtypes -> the step's concrete function
        self._multi: Callable | None = None

    def arguments(self, x: Any, ys: dict[str, Any]) -> tuple:
        """What the compiled step takes for one whole batch: the batch and the targets the stages learn."""
        return x, {k: ys[k] for k in self._targets}

    @functools.cached_property
    def _targets(self) -> list[str]:
        return self.wanted_targets()  # the stages' targets do not change: worked out once, not per step

    def call(self, x: Any, ys: dict[str, Any]) -> Any:
        """Train one whole batch (already checked); returns the step's report as a NumPy row.

        Calls the step's concrete function for the batch's shapes directly: tf.function's own
        dispatch (matching arguments against traces) costs ~0.1 ms a call on a 2-core machine
        (scripts/bench_overhead.py); the traces are tf.function's.
        """
        args = self.arguments(x, ys)
        key = tuple((tuple(t.shape), t.dtype) for t in tf.nest.flatten(args))
        fn = self._concrete.get(key)
        if fn is None:
            fn = self._concrete[key] = self.step_fn.get_concrete_function(*args)
        return fn(*args).numpy()

    def call_many(self, iterator: Any, n: int) -> Reports:
        """Up to `n` steps on the iterator's next batches in one call (`chain.steps.report.repeat`);
        their reports (`Reports`: an [m, size] NumPy array, m < n only when on_nan=stop ended the
        call, and each step's wait for its batch)."""
        from chain.steps.report import repeat

        if not self.steps_in_one_call:
            return self._call_each(iterator, n)
        if self._multi is None:
            self._multi = repeat(self.body, self.layout, self.settings.trainer.on_nan == "stop")
        rows, waits = self._multi(iterator, tf.constant(n, tf.int32))
        return Reports(rows.numpy(), tuple(1000.0 * waits.numpy()))

    def _call_each(self, iterator: Any, n: int) -> Reports:
        """`n` calls of `call`, one step each: the same results as one call of `n` steps (each
        batch's wait timed on the host, around `next`)."""
        rows, waits = [], []
        for _ in range(n):
            start = time.perf_counter()
            batch = next(iterator)
            waits.append(1000.0 * (time.perf_counter() - start))
            rows.append(self.call(*batch))
            if self.settings.trainer.on_nan == "stop" and self.layout.decode(rows[-1])[1]:
                break  # as the in-graph loop: no step after one whose update was dropped
        return Reports(np.stack(rows), tuple(waits))

    def position(self) -> Any:
        """Where the running step is, readable from another thread while it runs (a pipeline step's
        `chain.pipeline.stalled.Position`), or None: this strategy's step leaves no markers."""
        return None

    def waiting(self, position: Any) -> list[str]:
        """`position` in words: the schedule's grid and where each device waits (a pipeline step's)."""
        return []

    def trace(self, x: Any, ys: dict[str, Any]):
        """The compiled step's concrete function for this batch's shapes (its graph, for audits)."""
        return self.step_fn.get_concrete_function(*self.arguments(x, ys))

    def restored(self) -> None:
        """Called after a checkpoint was restored into `self.stages` (a strategy holding more copies
        of them brings the others along)."""

    def stream_shares(self) -> StreamShares | None:
        """The replicas whose own shares of a streamed data set this process reads
        (`chain.data.stream_shares`); None: one stream of whole batches."""
        return None

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

    def summary(self, summary: Summary) -> Summary:
        """`summary` with the strategy's own fields of summary.json (its sections) filled in."""
        return summary

    def complete(self, summary: Summary) -> Summary:
        """The finished summary, with anything the strategy derives from the whole of it."""
        return summary

    def plan_text(self, full: bool) -> str | None:
        """What the run prints about its plan beyond the placement table (e.g. the schedule)."""
        return None

    def make_eval(self) -> Callable:
        """The compiled evaluation: `fn(dataset)` -> each read-out's metrics (`chain.steps.evaluate`).

        Each stage's forward pass runs where the stage lives: on its device (pipelined), or
        in cross-replica context over the mirrored variables (every replica holds the same).
        """
        return evaluation(self.stages, self.readouts(), self.chained)

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

    @property
    def layout(self):
        """Where the step's report holds its losses and guard flags (`chain.steps.report.Layout`)."""
        raise NotImplementedError

    def read(self, row: Any) -> StepResult:
        """A step's report -> its loss, each stage's own loss ([] when stages have none) and the
        stages whose update the numerics guard dropped (before `chain.steps.numerics.judge`)."""
        raise NotImplementedError

    def report_values(self, flags: list, losses: ReplicaLosses, norm: Any = None) -> list[list]:
        """Each stage's values in the step's report, from its guard flag and the step's losses
        (each stage's own, or the chain's) and the global gradient norm (`optim.clip_global_norm`),
        laid out as `layout` says."""
        raise NotImplementedError

    def stage_summary(self, stage: Stage, entry: StageSummary, first: LossRecord, last: LossRecord) -> StageSummary:
        """`entry` (stage's in summary.json) with the objective's per-stage fields filled in, from
        the loss records of the first and last steps."""
        return entry

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

    @functools.cached_property
    def layout(self):
        return Layout.per_stage(len(self.stages))

    def read(self, row: Any) -> StepResult:
        losses, skipped = self.layout.decode(row)
        return StepResult(float(sum(losses)), losses, skipped)  # the step's loss: the sum of the stages'

    def report_values(self, flags: list, losses: ReplicaLosses, norm: Any = None) -> list[list]:
        return [[losses.stages[s.index], f] for s, f in zip(self.stages, flags)]

    def stage_summary(self, stage: Stage, entry: StageSummary, first: LossRecord, last: LossRecord) -> StageSummary:
        own = StageLosses(stage.target.name, first.stage_losses[stage.index], last.stage_losses[stage.index])
        return replace(entry, own=own)

    def readouts(self) -> list[Readout]:
        return [Readout(f"head_{s.index}", s.device, s.target, losses.head_loss(s.target), (s.index,))
                for s in self.stages]

    def evaluation(self, metrics: list[dict[str, float]]) -> Evaluation:
        # Like the training loss, the validation loss is the sum of the stages' own losses.
        return Evaluation(sum(m["loss"] for m in metrics), metrics, None)


def token_metrics(loss: float) -> dict[str, float]:
    """What a per-token cross-entropy (nats per token, the mean over real tokens) is usually read as:
    `perplexity` (its exponential; inf past float range) and `bits_per_token` (it over ln 2)."""
    return {"perplexity": math.inf if loss > 709 else math.exp(loss), "bits_per_token": loss / math.log(2)}


def unweighted_shares(settings: Any, what: str) -> None:
    """One line for `ignore_class` where the batch is cut into shares that each take their own mean
    (`what`): their real labels' numbers would weigh them, which only one pipeline's step does."""
    if settings.ignore_class is not None:
        raise ConfigError(f"ignore_class={settings.ignore_class} is not supported with {what}: each share of the "
                          "batch would average its own real labels; train on one pipeline (a device per stage), or "
                          "ignore_class=null")


class ChainObjective(Strategy):
    """mode=e2e: the chain is one network; the last stage ends in a read-out, one loss after it."""

    readout = True

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
    def layout(self):
        return Layout.chain(len(self.stages), norm=self.clip_global_norm is not None)

    def read(self, row: Any) -> StepResult:
        losses, skipped = self.layout.decode(row)
        return StepResult(losses[0], [], skipped, self.layout.grad_norm(row))  # no stage has a loss of its own

    def report_values(self, flags: list, losses: ReplicaLosses, norm: Any = None) -> list[list]:
        extra = [norm] if self.layout.norm is not None else []
        return [[f] for f in flags[:-1]] + [[flags[-1], losses.chain[0], *extra]]

    def summary(self, summary: Summary) -> Summary:
        return super().summary(replace(summary, chain=ChainFields(self.settings.loss, self.target.name)))

    def readouts(self) -> list[Readout]:
        last = self.stages[-1]
        return [Readout(f"body_{last.index}", last.device, self.target, self.loss_fn(),
                        tuple(s.index for s in self.stages))]

    def evaluation(self, metrics: list[dict[str, float]]) -> Evaluation:
        (chain,) = metrics
        if self.settings.loss == "sparse_categorical_crossentropy" and (
                self.target.shape or self.settings.ignore_class is not None):
            chain = {**chain, **token_metrics(chain["loss"])}
        return Evaluation(chain["loss"], [], chain)
