"""What every way of training provides: the `Strategy` interface, a distribution holding an objective.

A *distribution* (a subclass of `Strategy`) says where the stages live and how one batch
becomes one update (`chain.strategies.device_per_stage.DevicePerStage`: each stage on its device, each
learning on its own; `chain.pipeline.strategy.Scheduled`: a pipeline schedule over
microbatches; `chain.strategies.mirrored.Mirrored`: every stage on every replica; ...). An
*objective* (`chain.strategies.objectives`) says what is learned (`LocalObjective`: each stage
its own head and loss; `ChainObjective`: the chain is one network with one loss). A strategy is
one distribution given one objective (`chain.training.ways.TABLE` pairs them), not a class per
pair: the objective's answers are `strategy.objective`'s, and the methods below that are the
objective's pass its answers on. `chain.training.run.Run` drives any strategy through this
interface (every method it calls is declared here, with a default where one makes sense) and
never asks which one it has.
"""

from __future__ import annotations

import functools
import time
from abc import ABC, abstractmethod
from typing import Any, Callable, Sequence

import numpy as np
import tensorflow as tf

from chain.config.checks import BatchCut
from chain.config.schema import Settings
from chain.errors import ConfigError
from chain.data.catalog import DataInfo
from chain.data.stream_shares import StreamShares
from chain.planning.planner import Assignment
from chain.records.results import LossRecord, StepResult
from chain.records.summaries import StageSummary, Summary
from chain.stages import losses, tied_weights
from chain.stages.assemble import build_stages
from chain.stages.stage import Stage
from chain.steps.report import ReportFormat, Reports
from chain.steps.evaluate import evaluation
from chain.strategies.objectives import Evaluation, Objective


def _added_losses(stage: Stage) -> int:
    """How many `add_loss` terms `stage`'s model adds (`losses.added_losses`), probed on its device."""
    with tf.device(stage.device):
        return losses.added_losses(stage.model)


class Strategy(ABC):
    """One way of training: a distribution (this class's subclass) holding an objective.

    Built from its objective's class (`learns`, whose `heads`, `readout` and `chained` say what
    the stages are built with); once the stages are built, `objective` is that objective over
    them. A distribution implements `make_step` (a traceable step returning the step's report,
    `chain.steps.report`) and overrides the hooks below where its default does not hold.
    `schedule` is the pipeline schedule (None when the strategy has none).
    """

    name: str  # summary.json's `strategy`: the distribution's (`Assignment.topology`, or side_by_side)
    title: str  # the distribution's word in the way's name (`way`: DevicePerStageLocal, MirroredChain, ...)
    steps_in_one_call: bool = True  # False: `call_many` calls one step at a time (`_call_each`)
    schedule = None
    progress = None  # a pipeline step's markers (`trainer.stall_s`: `position`, `waiting`)
    shared_weights: bool = False  # True: its step sums the gradients of a weight several stages hold
    weighs_added_losses: bool = False  # True: its step can weigh each part's add_loss terms (pipeline.add_loss)

    def __init__(
        self,
        settings: Settings,
        assignment: Assignment,
        info: DataInfo,
        batch_cut: BatchCut,
        learns: type[Objective],
        bodies: Sequence | None = None,
        labels: Sequence[str | None] | None = None,
    ):
        self.settings = settings
        self.assignment = assignment
        self.info = info
        self.batch_cut = batch_cut
        self.learns = learns
        self.bodies, self.labels = bodies, labels  # stage bodies not from the config (chain.stages.bodies)
        self.stages: list[Stage] = self.build_stages()
        self.objective: Objective = learns(settings, info, self.stages)
        self.traces: dict[str, int] = {}  # the batch's input shape (batch axis left out) -> the step's traces
        self.set_step(self.make_step())
        self.eval_fn: Callable | None = None  # compiled on the first evaluation

    @property
    def way(self) -> str:
        """This way of training's name in messages: the distribution's word, then the objective's."""
        return f"{self.title}{self.learns.title}"

    @property
    def chained(self) -> bool:
        """Stage k takes stage k-1's output (False: every stage takes the data): the objective's."""
        return self.learns.chained

    # --- distribution: where the stages live and how a batch becomes an update --------------

    def devices(self) -> Sequence[str | None]:
        """Each stage's device (None: the strategy's own scope places it)."""
        return self.assignment.devices

    def build_stages(self) -> list[Stage]:
        """Every stage built on its device (`chain.stages.assemble`); a user's model with `add_loss`
        terms is refused when a device computes its loss on parts of a batch (`parts`)."""
        stages = self.build_copy(self.devices())
        self._refuse_shared_weights(stages)
        parts = self.parts()
        if parts is not None:
            self._added_losses_on_parts(stages, parts)
        with_terms = [str(st.index) for st in stages if losses.regularized(st.model, st.head)]
        if with_terms:
            self.assignment = self.assignment.noted(  # a new record: the one planned is never changed
                f"the loss of stage(s) {', '.join(with_terms)} includes their regularizers "
                "(model.losses), as Keras' fit: the logged loss is the loss plus these terms"
            )
        return stages

    def _added_losses_on_parts(self, stages: Sequence[Stage], parts: str) -> None:
        """A user's stages adding `add_loss` terms when a device computes its loss in `parts`: a note
        under `pipeline.add_loss=per_microbatch` where the step weighs each part's terms by its share of
        the batch (`weighs_added_losses`), else a ConfigError: on parts of a batch a term need not add
        up to the whole batch's, which Keras' `fit` minimizes."""
        counts = [
            (stage, _added_losses(stage))
            for stage, body in zip(stages, self.bodies or [None] * len(stages))
            if body is not None
        ]  # the chain's own bodies add no losses
        counts = [(stage, n) for stage, n in counts if n]
        if not counts:
            return
        per_microbatch = self.settings.pipeline.add_loss == "per_microbatch"
        if per_microbatch and self.weighs_added_losses:
            indices = ", ".join(str(st.index) for st, _ in counts)
            self.assignment = self.assignment.noted(  # a new record: the one planned is never changed
                f"pipeline.add_loss=per_microbatch: the add_loss terms of stage(s) {indices} "
                f"are computed per microbatch ({self.cut_description()}) and weighed by its share of the batch (as "
                "Megatron and DeepSpeed do): exact for a term that is a mean over examples, not for one computed over "
                "the batch as a whole, such as an MoE's load-balancing loss over its tokens' routing"
            )
            return
        stage, n = counts[0]
        if self.weighs_added_losses:
            options = (
                "pipeline.add_loss=per_microbatch (each part's terms weighed by its share of the batch), or "
                "pipeline.microbatches=1 and trainer.grad_accum=1"
            )
        else:
            options = "trainer.grad_accum=1"
        besides = (
            f"pipeline.add_loss=per_microbatch is mode=e2e's pipeline's only, not {self.way}'s: "
            if per_microbatch and not self.weighs_added_losses
            else ""
        )
        raise ConfigError(
            f"stage {stage.index} ({stage.describe()}) adds {n} loss term(s) with add_loss, and {parts} "
            "would compute them on parts of each batch, which equals the whole batch's term only for a "
            f"mean over examples: {besides}use {options}, or an activity_regularizer (Keras averages "
            "those over the batch)"
        )

    def build_copy(self, devices: Sequence[str | None]) -> list[Stage]:
        """One set of the stages on `devices`, built as the objective says (its heads, read-out and
        chaining) from the run's seed."""
        s, kind = self.settings, self.learns
        return build_stages(
            s.stages,
            devices,
            self.info,
            heads=kind.heads,
            readout=kind.readout,
            precision_name=s.precision,
            initial_loss_scale=s.trainer.initial_loss_scale,
            bodies=self.bodies,
            labels=self.labels,
            chained=kind.chained,
            seed=s.seed,
        )

    def _refuse_shared_weights(self, stages: Sequence[Stage]) -> None:
        """A ConfigError if two stages hold copies of one weight (a cut model's tied weight) and this
        strategy's step does not sum their gradients (mode=e2e's steps do)."""
        found = tied_weights.users(stages)
        if found and not self.shared_weights:
            name, users = next(iter(found.items()))
            a, b = users[:2]
            raise ConfigError(
                f"stages {a} and {b} both use the weight {name!r} (a tied weight of the cut model); only "
                f"mode=e2e (its pipeline, copies of it, or the mirrored fallback) sums its copies' "
                f"gradients, not {self.way}: use mode=e2e, or cut the model so one stage "
                "holds every layer using it"
            )

    def parts(self) -> str | None:
        """How a device splits a batch to compute a stage's loss (its chunks), or None when it
        computes it on its whole share at once. (Replicas do not count: Keras itself computes
        `model.losses` per replica.)"""
        n = self.settings.trainer.grad_accum
        return f"trainer.grad_accum={n} equal chunks" if n > 1 else None

    @abstractmethod
    def make_step(self) -> Callable:
        """The step, traceable: `fn(*self.arguments(x, ys)) -> report` trains one batch."""

    def set_step(self, body: Callable) -> None:
        """Use `body` (traceable: one step, inside `repeat`'s loop too) as the step, dropping every
        trace and compiled loop made from the one before."""
        self.body = self._counted(body)
        # autograph=False: the steps' Python control flow is over Python values (unrolled on purpose),
        # and Keras 3 traces its own train step unconverted too (do_not_convert), so user layers see
        # what they see in model.fit; converting would only cost CPU (docs/benchmarks-in-code.md).
        self.step_fn = tf.function(self.body, autograph=False)
        self._concrete: dict[tuple, Any] = {}  # argument shapes and dtypes -> the step's concrete function
        self._multi: Callable | None = None

    def _counted(self, body: Callable) -> Callable:
        """`body`, counting in `traces` each time it is traced (Python runs only while tracing)."""

        def counted(*args):
            first = tf.nest.flatten(args)[0]
            shape = (first.shape if hasattr(first, "shape") else first.values[0].shape)[1:]  # a mirrored PerReplica
            key = "x".join("?" if n is None else str(n) for n in shape)
            self.traces[key] = self.traces.get(key, 0) + 1
            return body(*args)

        return counted

    def arguments(self, x: Any, ys: dict[str, Any]) -> tuple:
        """What the compiled step takes for one whole batch: the batch and the targets the stages learn."""
        return x, {k: ys[k] for k in self._targets}

    @functools.cached_property
    def _targets(self) -> list[str]:
        return self.wanted_targets()  # the stages' targets do not change: worked out once, not per step

    def call(self, x: Any, ys: dict[str, Any]) -> Any:
        """Train one whole batch (already checked); returns the step's report as a NumPy row.

        Calls the step's concrete function for the batch's shapes directly: tf.function's own
        dispatch (matching arguments against traces) costs time every call (docs/benchmarks-in-code.md);
        the traces are tf.function's.
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

        if not self.steps_in_one_call or self.settings.data.lengths_vary:  # a trace per bucket's shape
            return self._call_each(iterator, n)
        if self._multi is None:
            stop = self.settings.trainer.on_nan == "stop"
            self._multi = repeat(self.body, self.report_format, stop, self.settings.examples_per_step)
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
            if self.settings.trainer.on_nan == "stop" and self.report_format.decode(rows[-1])[1]:
                break  # as the in-graph loop: no step after one whose update was dropped
        return Reports(np.stack(rows), tuple(waits))

    def position(self) -> Any:
        """Where the running step is, readable from another thread while it runs (a pipeline step's
        `chain.pipeline.stalled.Position`), or None: this strategy's step leaves no markers."""
        return None

    def steps_begun(self) -> int | None:
        """`position().started` alone (one read where `position` reads every marker), or None: no markers."""
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
        return None

    def stream_shares(self) -> StreamShares | None:
        """The replicas whose own shares of a streamed data set this process reads
        (`chain.data.stream_shares`); None: one stream of whole batches."""
        return None

    def batch_divisor(self) -> int:
        """A whole batch's size must be a multiple of this: its chunks (`trainer.grad_accum`), each cut as
        the run's `batch_cut` says (replicas, microbatches)."""
        return self.settings.trainer.grad_accum * self.batch_cut.replicas * self.batch_cut.microbatches

    def check_batch(self, n: int) -> None:
        """ValueError unless a batch of `n` examples cuts into what the step needs, described whole."""
        d = self.batch_divisor()
        if n % d:
            raise ValueError(
                f"a batch of {n} examples does not cut into {self.cut_description()}; "
                f"pass x and y with a multiple of {d} examples"
            )

    def cut_description(self) -> str:
        return f"trainer.grad_accum={self.settings.trainer.grad_accum} equal chunks"

    def memory_devices(self) -> list[str]:
        """The devices whose peak memory the run reports."""
        return [s.device for s in self.stages]

    def summary(self, summary: Summary) -> Summary:
        """`summary` with the strategy's own fields of summary.json (its sections) filled in: the
        objective's, then the distribution's (a subclass adds its own to this)."""
        return self.objective.summary(summary)

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
        return evaluation(self.stages, self.objective.readouts(), self.chained)

    def evaluate(self, dataset: tf.data.Dataset) -> Evaluation:
        """The chain on every batch of `dataset` (the validation set)."""
        if self.eval_fn is None:
            self.eval_fn = self.make_eval()
        return self.objective.evaluation(self.eval_fn(dataset))

    def timeline(self) -> Any:
        """The schedule played with unit-time actions (`chain.schedule.schedules.Timeline`: its plan
        and bubble), or None: this strategy runs no schedule."""
        return None

    # --- the objective's answers (`self.objective`), asked through the strategy -----------------

    def wanted_targets(self) -> list[str]:
        """The targets the step reads (each batch must hold them)."""
        return self.objective.wanted_targets()

    def default_target(self) -> str | None:
        """The target a bare `y` given to `Run.step` stands for (None: a bare y is ambiguous)."""
        return self.objective.default_target()

    @property
    def report_format(self) -> ReportFormat:
        """Where the step's report holds its losses and guard flags (`chain.steps.report.ReportFormat`)."""
        return self.objective.report_format

    def read(self, row: Any) -> StepResult:
        """A step's report -> its loss, each stage's own loss ([] when stages have none) and the
        stages whose update the numerics guard dropped (before `chain.steps.numerics.judge`)."""
        return self.objective.read(row)

    def stage_summary(self, stage: Stage, entry: StageSummary, first: LossRecord, last: LossRecord) -> StageSummary:
        """`entry` (stage's in summary.json) with the per-stage fields filled in, from the loss
        records of the first and last steps (the objective's; a distribution may add its own)."""
        return self.objective.stage_summary(stage, entry, first, last)
