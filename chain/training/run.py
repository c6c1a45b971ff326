"""A run: the training loop around a strategy, with its data stream, evaluations, checkpoints,
logs and summary.

`Run` never asks which way of training it drives: the strategy
(`chain.strategies.base.Strategy`) builds the stages, compiles the step, checks and splits a
batch, turns the step's outputs into losses, evaluates the chain on the validation set and
adds its own summary fields. Which steps save a checkpoint, evaluate, log or are profiled, and
how many steps each call of the compiled step runs, `chain.training.cadence` says.
"""

from __future__ import annotations

import array
import contextlib
import logging
import math
import os
import statistics
import time
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Callable

from chain.config.schema import Settings
from chain.data import verify as checks
from chain.data.stream import training_batches, validation_batches
from chain.data.loader import Dataset
from chain.errors import ChainError, StorageError, first_line
from chain.autoplan import table
from chain.autoplan.step_check import PlanCheck
from chain.planning import memory
from chain.records.auto_plan import AutoPlan
from chain.records.results import LossHistory, LossRecord, StepResult
from chain.records.serial import from_json, to_json
from chain.records.summaries import DataWait, Summary
from chain.state import manifest
from chain.state.atomic import write_json, writing
from chain.steps.numerics import finite_or_none, judge
from chain.strategies.base import Strategy
from chain.strategies.objectives import Evaluation
from chain.training import failures, on_lost, validation
from chain.training.cadence import Cadences
from chain.training.summary import Ending, summarize

if TYPE_CHECKING:
    from chain.state.checkpoints import Checkpoints
    from chain.training.logs import Writers

log = logging.getLogger("chain")
BEST_DIR = "best"  # checkpoint.best: the checkpoint of the lowest validation loss


@dataclass
class _Loop:
    """What `Run.fit` carries from step to step: where it saves and writes, and what it has seen."""

    checkpoints: Checkpoints | None  # this run's; None: the run has no directory
    best: Checkpoints | None  # best/'s (checkpoint.best)
    writers: Writers | None  # TensorBoard; None: the run has no directory
    first: LossRecord | None  # the loss record of step 1 (restored on resume)
    last: LossRecord | None  # the loss record of the newest step
    resumed_from: int | None  # the restored step (resume=true), else None
    saved_at: int | None  # the step of the newest checkpoint (on resume, the restored one)
    evaluation: Evaluation | None = None  # the newest evaluation, made at step `evaluated_at`
    evaluated_at: int | None = None
    started: float | None = None  # when the first call ended: the speed leaves it out (it traces)
    timed_steps: int = 0  # steps taken since `started`
    waits: array.array = field(default_factory=lambda: array.array("d"))  # ms each timed step waited for its batch
    step_ms: array.array = field(default_factory=lambda: array.array("d"))  # each timed step's share of its call (ms)

    def timed(self, waits_ms: tuple[float, ...], call_s: float = 0.0) -> None:
        """Count a call for the speed, the data wait (its steps' waits for their batches, in ms) and the
        step time (`call_s`: the call's seconds, shared evenly among its steps): the first call of the
        process only starts the clock (it starts the stream and traces)."""
        if self.started is None:
            self.started = time.perf_counter()
        else:
            self.timed_steps += len(waits_ms)
            self.waits.extend(waits_ms)
            self.step_ms.extend([1000.0 * call_s / len(waits_ms)] * len(waits_ms))

    def median_step_ms(self) -> float | None:
        """The median of the timed steps' times in ms (None: no step was timed)."""
        return statistics.median(self.step_ms) if self.step_ms else None

    def data_wait(self) -> DataWait | None:
        """Mean and 95th percentile of the timed steps' waits (None: no step was timed)."""
        if not self.waits:
            return None
        ordered = sorted(self.waits)
        p95 = ordered[min(len(ordered) - 1, math.ceil(0.95 * len(ordered)) - 1)]  # nearest rank
        return DataWait(mean=sum(ordered) / len(ordered), p95=p95, steps=len(ordered))

    def elapsed(self) -> float:
        """Seconds since the first call ended (0: no call has)."""
        return time.perf_counter() - self.started if self.started is not None else 0.0


class Run:
    """Everything one training run needs; `step` trains one batch, `fit` the whole run.

    `global_step` counts the optimizer steps taken (restored from a checkpoint on
    resume); `fit` trains until it reaches `trainer.steps` (what `trainer.epochs` makes of
    the training examples, when given), or until early stopping. `tracker` follows the
    evaluations on the validation set (`chain.training.validation`).
    """

    def __init__(
        self,
        settings: Settings,
        strategy: Strategy,
        dataset: Dataset,
        run_dir: str | None,
        auto_plan: AutoPlan | None = None,
    ):
        self.settings = settings
        self.strategy = strategy
        self.dataset = dataset
        self.run_dir = run_dir
        self.assignment = strategy.assignment
        self.stages = strategy.stages
        self.global_step = 0
        self._iterator = None
        self._validation = None
        self.tracker = validation.Tracker(settings.trainer.early_stop_patience)
        self._checkpoints: dict[str, Any] = {}
        self._files: Any = False  # the streamed files' stamps (chain.data.identity), taken once: False before
        self._release = False  # fit took the run directory's lock and gives it back when done
        self.watchdog = None  # a multi-worker run's chain.planning.cluster.Watchdog: stopped when fit ends
        self.summary: Summary | None = None  # what fit wrote to summary.json, as its record (None before)
        self._rates: Any = False  # each stage's scheduled learning rate by update (lr_schedules.rates): False before
        self.auto_plan = auto_plan  # placement.plan=auto: what the search chose (None: a plan by hand)
        self._feeder: Any = False  # the first model's named inputs from one array (named_inputs.feeder): False before

    @property
    def schedule(self):
        """The pipeline schedule the step runs (`chain.schedule.schedules.Schedule`), or None."""
        return self.strategy.schedule

    def timeline(self):
        """The schedule played with unit-time actions (for its bubble and the plan), or None."""
        return self.strategy.timeline()

    @property
    def notes(self) -> list[str]:
        """`note:` lines about the placement and about settings this run ignores."""
        return [*self.assignment.notes, *self.settings.notes]

    @property
    def batch_size(self) -> int:
        """`data.batch_size`: examples per chunk (per step without gradient accumulation)."""
        return self.settings.data.batch_size

    @property
    def grad_accum(self) -> int:
        """`trainer.grad_accum`: chunks of `batch_size` examples per optimizer step."""
        return self.settings.trainer.grad_accum

    @property
    def examples_per_step(self) -> int:
        """Examples behind one optimizer step: `grad_accum` x `batch_size`."""
        return self.settings.examples_per_step

    def batches(self):
        """The shared `tf.data` pipeline of training batches, one per step (`examples_per_step` each;
        a host of a multi-host mirrored run streaming its data: its own replicas' shares of them), its
        arrays made the first model's named inputs when it has them (`chain.stages.named_inputs`)."""
        return self._named(
            training_batches(
                self.dataset,
                self.examples_per_step,
                self.settings.data.shuffle,
                self.settings.seed,
                self.strategy.stream_shares(),
            )
        )

    def _named(self, batches):
        """`batches` of `(x, ys)` with `x` made the first model's named inputs, when it takes some."""
        if batches is None or self._named_inputs() is None:
            return batches
        named = self._named_inputs()
        return batches.map(lambda x, ys: (named(x), ys))

    def _named_inputs(self):
        """`named_inputs.feeder` of the first stage's model (None: it takes the array), made once; a model
        whose named inputs one array cannot make is refused here, when the config's data first meets it."""
        from chain.stages import named_inputs

        if self._feeder is False:
            self._feeder = named_inputs.feeder(self.stages[0].model)
        return self._feeder

    @property
    def iterator(self):
        """The run's iterator over `batches()`: the data stream that checkpoints save."""
        if self._iterator is None:
            self._iterator = iter(self.batches())
        return self._iterator

    def validation_batches(self):
        """The validation set in batches (`tf.data`, of `examples_per_step` at most), or None when
        the data set has none."""
        if self._validation is None:
            self._validation = self._named(validation_batches(self.dataset, self.examples_per_step))
        return self._validation

    def evaluate(self) -> Evaluation | None:
        """The chain on the whole validation set (`chain.strategies.base.Evaluation`: each stage's
        metrics in mode=local, the chain's in mode=e2e); None when the data set has none."""
        batches = self.validation_batches()
        return None if batches is None else self.strategy.evaluate(batches)

    def checkpoints(self, run_dir: str | None = None, keep: int | None = None):
        """The `Checkpoints` of `run_dir` (default: this run's directory) for this chain, keeping
        `keep` complete steps (default: `checkpoint.keep`)."""
        from chain.state.checkpoints import Checkpoints

        run_dir = run_dir or self.run_dir
        if run_dir is None:
            raise ChainError("this run has no directory: build it with chain.build(cfg, run_dir=...) to checkpoint")
        if run_dir not in self._checkpoints:
            self._checkpoints[run_dir] = Checkpoints(
                run_dir, self.stages, self.iterator, self.settings, keep, self.stream_files()
            )
        return self._checkpoints[run_dir]

    def stream_files(self):
        """The stamps of the files a streamed data set reads (`chain.records.stream_files.StreamFiles`),
        taken once, when the run first checkpoints or restores: every checkpoint records them and a
        resume compares them (`chain.data.identity`); None when the data is not streamed from files."""
        if self._files is False:
            from chain.data.identity import stamps

            self._files = stamps(self.dataset.shards) if self.dataset.shards is not None else None
        return self._files

    def restore(self, run_dir: str | None = None, fallback: bool = False) -> dict[str, Any]:
        """Restore the newest complete checkpoint of `run_dir` (default: this run's); returns its manifest.

        Every file is verified against the digests the save recorded; a damaged or foreign
        newest checkpoint raises `CheckpointError` naming the file and the newest older step
        that verifies, which `fallback=True` restores instead.
        """
        m = self.checkpoints(run_dir).restore(fallback=fallback)
        self.strategy.restored()
        self.global_step = m["step"]
        self.tracker.restore(m.get("validation", {}).get(str(m["step"])))
        return m

    def _batch(self, x: Any, y: Any) -> tuple[Any, dict]:
        """A batch given to `step` or `trace`, checked once (`chain.data.verify`): one ValueError
        line naming the argument for a wrong shape, dtype, label or target."""
        wanted, default = self.strategy.wanted_targets(), self.strategy.default_target()
        x, ys = checks.batch(x, y, self.dataset.info, wanted, default, self.settings.ignored_label)
        self.strategy.check_batch(len(next(iter(x.values()))) if isinstance(x, dict) else len(x))
        if not isinstance(x, dict) and self._named_inputs() is not None:  # token ids for a model of named inputs
            x = self._named_inputs()(x)
        return x, ys

    def step(self, x: Any, y: Any) -> dict[str, Any]:
        """One optimizer step on one batch (of `examples_per_step` examples, as `batches()` yields).

        `y` is a dict of targets or one array (mode=e2e: the chain's target; mode=local:
        the data set's first target). Shapes, dtypes and labels are checked first: a value
        target may be (N,) or (N, 1); class labels are integers in range. With `trainer.grad_accum=N` the batch is cut into N
        equal chunks whose gradients are summed before the one update. Returns `loss`,
        `stage_losses` and `skipped` (a dict: `chain.records.results.StepResult` as JSON). mode=local:
        each stage's own loss, and their sum.
        mode=e2e: the chain's mean loss over the batch; `stage_losses` is empty, because
        no stage has a loss of its own. `skipped` lists the stages whose update the
        numerics guard dropped; under `trainer.on_nan=stop` a dropped update raises
        `NonFiniteError` naming the stages and the step instead (a float16 loss-scale
        overflow is neither: see `chain.stages.loss_scale`).
        """
        return to_json(self._train(*self._batch(x, y)))

    def _train(self, x: Any, ys: dict) -> StepResult:
        """One step on a batch known to be right (checked, or from the run's own data stream)."""
        return self._finish(self.strategy.call(x, ys))

    def steps(self, n: int) -> list[dict[str, Any]]:
        """`n` optimizer steps in one call of the compiled function, on the next `n` batches of
        `iterator` (`trainer.steps_per_call`); returns what `step` returns, one per step.

        The same batches and the same updates as `n` calls of `step` on `next(iterator)`, bit
        for bit. The host reads the steps' losses and guard flags once, after the call. Under
        `trainer.on_nan=stop` the call ends after the first step whose update the guard
        dropped (no later step runs or takes a batch) and NonFiniteError names that step.
        """
        return [to_json(r) for r in self._steps(n)[0]]

    def _steps(self, n: int) -> tuple[list[StepResult], tuple[float, ...]]:
        """`n` steps in one call: their results, and how long each waited for its batch (ms)."""
        reports = self.strategy.call_many(self.iterator, n)
        return [self._finish(row) for row in reports.rows], reports.waits_ms

    def _finish(self, row: Any) -> StepResult:
        """Count a step and let the numerics guard judge it, from its report `row`."""
        self.global_step += 1
        result = self.strategy.read(row)
        return replace(result, skipped=judge(self.global_step, result.skipped, self.settings.trainer.on_nan))

    def trace(self, x: Any, y: Any):
        """The compiled step's concrete function for a batch like this one: its graph shows where
        every op runs (tests/graph_audit.py reads it)."""
        return self.strategy.trace(*self._batch(x, y))

    def forward(self, x: Any) -> dict[str, Any]:
        """Inference outputs of every stage: `body_k` (stage k's model) and `head_k` (its head)."""
        from chain.steps.inference import forward

        return forward(self.stages, x, self.strategy.chained)

    def _start(self) -> tuple[Any, LossRecord | None, LossRecord | None]:
        """Checkpoints of this run and, on resume, the restored state: (checkpoints, loss_first, loss_last)."""
        if not self.run_dir:
            if self.settings.resume:
                raise ChainError("resume=true needs a run directory to resume from")
            return None, None, None
        from chain.state import lock

        if not lock.held(self.run_dir):  # the command line locked it already; the Python API did not
            lock.acquire(self.run_dir)
            self._release = True
        ckpts = self.checkpoints()
        if self.settings.resume:
            m = self.restore(fallback=self.settings.checkpoint.fallback)
            steps = self.settings.trainer.steps
            if m["step"] > steps:
                raise ChainError(
                    f"the checkpoint is at step {m['step']}, past trainer.steps={steps}; "
                    f"set trainer.steps to {m['step']} or more"
                )
            log.info("resumed from step %d (%s)", m["step"], os.path.join(self.run_dir, "checkpoint.json"))
            losses = from_json(LossHistory, m)
            return ckpts, losses.loss_first, losses.loss_last
        manifest.require_none(self.run_dir)
        return ckpts, None, None

    def fit(self, callback: Callable[[int, dict[str, Any]], None] | None = None) -> dict[str, Any]:
        """Train until `trainer.steps`; write checkpoints, TensorBoard, exports and summary.json.

        Evaluates on the validation set every `trainer.eval_every` steps and at the end,
        keeps the checkpoint of the lowest validation loss in `best/` (`checkpoint.best`) and
        stops after `trainer.early_stop_patience` evaluations without a lower one. With
        `resume=true` the run first restores the newest complete checkpoint of its directory
        (what the evaluations had found included). Returns the summary (also written to
        `summary.json` when the run has a directory). The run directory is locked while it
        trains (`chain.state.lock`). `callback(step, out)` is called after each step with
        what `step` returns. The summary is a dict (`chain.records.summaries.Summary` as JSON).
        """
        t = self.settings.trainer
        workers = self.assignment.cluster or self.assignment.multi_worker  # other processes a step needs
        try:
            with failures.one_line(self.run_dir, self.dataset, workers, self.settings.cluster.lost_after_s):
                self.summary = self._fit(t, callback)
            return to_json(self.summary)
        finally:
            if self.watchdog is not None:
                self.watchdog.stop()
            if self._release:
                from chain.state import lock

                lock.release(self.run_dir)
                self._release = False

    def _fit(self, t, callback) -> Summary:
        from tqdm import tqdm
        from tqdm.contrib.logging import logging_redirect_tqdm

        from chain.training.profile import Window
        from chain.training.stall import running_watch

        window = Window(self, *t.profile) if t.profile else None  # trainer.profile: the traced steps
        watch = running_watch(t, self.strategy, self.intact)  # trainer.stall_s: says where a step waits
        loop = self._open()
        predicted = None
        if self.auto_plan is not None:  # logged after the placement table: chain.log keeps what was chosen
            log.info("%s", table.one_line(self.auto_plan))
            predicted = 1000.0 * self.auto_plan.chosen.step_s
        cadences = Cadences.of(t, self.settings.checkpoint.every if loop.checkpoints else 0, predicted)
        memory.reset(self.strategy.memory_devices())
        bar = tqdm(
            total=t.steps,
            initial=self.global_step,
            desc="train",
            unit="step",
            disable=not t.progress or None,
            leave=False,
        )
        try:
            # Log lines go through tqdm, so they do not break the progress bar.
            with logging_redirect_tqdm(loggers=[logging.getLogger()]):
                while self.global_step < t.steps and not self.tracker.exhausted:  # exhausted: stopped early
                    n = cadences.call_length(self.global_step)
                    if watch:
                        watch.begin(self.global_step + 1, n)
                    begun, before = time.perf_counter(), loop.timed_steps
                    outs, waits = self._call(n, window)
                    if watch:
                        watch.end(n)
                    loop.timed(waits, time.perf_counter() - begun)
                    for step, out in enumerate(outs, self.global_step - len(outs) + 1):
                        self._after_step(step, out, loop, cadences, callback)
                    last = self.global_step >= t.steps or self.tracker.exhausted
                    if cadences.plan and cadences.plan.due(before, loop.timed_steps, last):
                        self._check_plan(cadences.plan, loop)
                    bar.set_postfix(loss=f"{outs[-1].loss:.4f}", refresh=False)
                    bar.update(len(outs))
            summary = self._close(loop, window)
        finally:
            if watch:
                watch.stop()
            bar.close()
            if window:
                window.close()
            if loop.writers:
                loop.writers.close()
        return self._write(summary, loop)

    def _open(self) -> _Loop:
        """The loop's state at its start: this run's checkpoints (restored from on resume), `best/`
        (`checkpoint.best`) and TensorBoard writers when it has a directory."""
        from chain.training.logs import Writers

        ckpts, first, last = self._start()
        resumed_from = self.global_step if self.settings.resume else None
        best = (
            self.checkpoints(os.path.join(self.run_dir, BEST_DIR), keep=1)
            if ckpts and self.settings.checkpoint.best
            else None
        )
        if best is not None:
            best.layouts = ckpts.layouts  # the run's layouts, as a resume found them
        writers = Writers(self.run_dir, len(self.stages)) if self.run_dir else None
        return _Loop(ckpts, best, writers, first, last, resumed_from, saved_at=resumed_from)

    def _call(self, n: int, window) -> tuple[list[StepResult], tuple[float, ...]]:
        """The next `n` steps in one call (a single step: `_train` on the next batch), traced inside
        the profiled window, and each step's wait for its batch in ms."""
        with window.call(self.global_step + 1, n) if window else contextlib.nullcontext():
            if n > 1:
                return self._steps(n)
            start = time.perf_counter()
            batch = next(self.iterator)
            wait = 1000.0 * (time.perf_counter() - start)
            return [self._train(*batch)], (wait,)

    def _after_step(self, step: int, out: StepResult, loop: _Loop, cadences: Cadences, callback) -> None:
        """What follows step `step` (its result `out`), each when its cadence is due: the loss
        record, TensorBoard point, log line, evaluation and checkpoint; then the test hooks and `callback`."""
        from chain import testhooks

        record = LossRecord(
            finite_or_none(out.loss),
            [finite_or_none(v) for v in out.stage_losses],
            finite_or_none(out.grad_norm) if out.grad_norm is not None else None,
        )
        chain_scalars = {"loss": out.loss}
        if out.grad_norm is not None:  # the global gradient norm before clipping (optim.clip_global_norm)
            chain_scalars["grad_norm"] = out.grad_norm
        if step == 1:
            loop.first = record
        loop.last = record
        point, due = loop.writers and cadences.logging.point(step), cadences.logging.due(step)
        lrs = self._learning_rates(step) if point or due else None
        if lrs is not None:  # optim.schedule: the rate this step's update used, on every stage
            chain_scalars.update(
                {"lr": lrs[0]} if len(set(lrs)) == 1 else {f"lr/stage_{k:02d}": v for k, v in enumerate(lrs)}
            )
        if point:
            loop.writers.scalars(step, [{"loss": v} for v in out.stage_losses], chain_scalars)
        if due:
            lr = "" if lrs is None else "  lr " + " ".join(f"{v:.3g}" for v in sorted(set(lrs), key=lrs.index))
            log.info("step %d  loss %s%s", step, "  ".join(f"{v:.4f}" for v in out.stage_losses or [out.loss]), lr)
        if cadences.evaluation.due(step):
            loop.evaluation, loop.evaluated_at = self._evaluate(step, loop), step
        if cadences.checkpoint.due(step):
            loop.checkpoints.save(step, loop.first, loop.last, self.tracker.state())
            loop.saved_at = step
            if loop.writers:
                loop.writers.flush()  # the curves up to a checkpoint survive a kill
        testhooks.after_step(step)
        if callback is not None:
            callback(step, to_json(out))

    def _learning_rates(self, step: int) -> list[float] | None:
        """Each stage's learning rate at step `step` (its optimizer's update step - 1), or None
        without a schedule (`chain.stages.lr_schedules.rates`, made once)."""
        if self._rates is False:
            from chain.stages import lr_schedules

            self._rates = lr_schedules.rates([s.optim for s in self.settings.stages])
        return None if self._rates is None else self._rates(step - 1)

    def _close(self, loop: _Loop, window) -> Summary:
        """After the last step: the final evaluation (every run ends evaluated), why it stopped
        early, and the summary (with the profiled window's measurements and the speed's point)."""
        elapsed = loop.elapsed()
        if loop.evaluated_at != self.global_step:
            loop.evaluation = self._evaluate(self.global_step, loop)
        if self.dataset.skipped_records:
            log.warning(
                "%d bad records left out of the stream (data.on_bad_record=skip; counted as read, read-ahead included)",
                self.dataset.skipped_records,
            )
        if self.global_step < self.settings.trainer.steps:
            log.info(
                "stopped early at step %d: no lower validation loss in %d evaluations (best: step %s)",
                self.global_step,
                self.tracker.evals_since_best,
                self.tracker.best_step,
            )
        ending = Ending(
            self.global_step,
            loop.first,
            loop.last,
            loop.resumed_from,
            loop.timed_steps,
            elapsed,
            loop.evaluation,
            self.tracker.best_step,
        )
        summary = self.strategy.complete(summarize(self.settings, self.strategy, self.dataset, ending))
        summary = replace(
            summary,
            data_wait_ms=loop.data_wait(),
            plan=table.plan_fields(self.auto_plan, loop.median_step_ms()),  # None: a plan by hand
            layouts=list(loop.checkpoints.layouts) if loop.checkpoints else None,  # what a resume changed, and when
            lost_workers=on_lost.history(self),  # cluster.on_lost: the workers lost while the run went on
        )
        if self.settings.data.lengths_vary:  # length buckets: each bucket's step traced once, never again
            shown = ", ".join(f"{n} for length {k}" for k, n in summary.traces.items())
            log.info("traces of the training step: %d (%s)", sum(summary.traces.values()), shown)
        if summary.steps_per_second is not None and summary.data_wait_ms is not None:
            wait = summary.data_wait_ms
            log.info(
                "speed: %.1f steps/s (%.0f examples/s); a step waited for its batch %.3f ms on average, "
                "%.3f ms at the 95th percentile (data_wait_ms, %d steps)",
                summary.steps_per_second,
                summary.examples_per_second,
                wait.mean,
                wait.p95,
                wait.steps,
            )
        if window:
            summary = window.add_to(summary)
        if loop.writers:
            loop.writers.scalars(self.global_step, [], {"examples_per_second": summary.examples_per_second or 0.0})
        return summary

    def _check_plan(self, check: PlanCheck, loop: _Loop) -> None:
        """plan=auto: one warning line when the measured step (the median so far) is further from the
        prediction than the check's margin, naming what may explain it."""
        measured, p = loop.median_step_ms(), self.assignment
        if measured is not None and check.off(measured):
            log.warning(
                "%s",
                table.mismatch(
                    self.auto_plan,
                    measured,
                    loop.timed_steps,
                    shared_threads=p.kind == "CPU" and not (p.cluster or p.multi_worker),
                    data_wait_ms=statistics.median(loop.waits),
                    traced=bool(self.settings.trainer.profile),
                ),
            )

    def _write(self, summary: Summary, loop: _Loop) -> Summary:
        """The run's last checkpoint (unless its last step saved one), exports, summary.json and report."""
        if loop.checkpoints and loop.saved_at != self.global_step:
            loop.checkpoints.save(self.global_step, loop.first, loop.last, self.tracker.state())
        if self.run_dir:
            if self.settings.checkpoint.export:
                summary = self._export(summary)
            with writing(os.path.join(self.run_dir, "summary.json")):
                write_json(os.path.join(self.run_dir, "summary.json"), to_json(summary))
            if self.settings.report:
                from chain.report import write_report

                log.info("report: %s", write_report(self.run_dir))
        return summary

    def intact(self, hint: bool = True) -> str:
        """What survives if the run stops now, in words (for a one-line error); `hint`: and how to go on."""
        return failures.intact(self.run_dir, hint)

    def _export(self, summary: Summary) -> Summary:
        """Write the .keras exports into the summary; a model Keras cannot serialise (a user's
        layer that is not registered) is a warning and an `export_error`, not a failed run."""
        from chain.state.export import export

        try:
            with writing(f"the exports (.keras files) in {self.run_dir}"):
                return replace(
                    summary,
                    exports=[os.path.basename(p) for p in export(self.stages, self.run_dir, self.strategy.chained)],
                )
        except StorageError:
            raise
        except Exception as e:  # Keras' serialisation raises TypeError, ValueError, NotImplementedError, ...
            text = first_line(e)
            log.warning("exports skipped: Keras cannot save this chain (%s); checkpoints are complete", text)
            return replace(summary, exports=[], export_error=text)

    def _evaluate(self, step: int, loop: _Loop) -> Evaluation | None:
        """Evaluate at `step`: log it, write its TensorBoard scalars, count it for the best
        checkpoint and early stopping, and save `best/` when it is the lowest validation loss."""
        evaluation = self.evaluate()
        if evaluation is None:
            return None
        log.info("step %d  %s", step, validation.line(evaluation))
        if loop.writers:
            loop.writers.scalars(step, *validation.scalars(evaluation))
        if self.tracker.record(step, evaluation.loss) and loop.best:
            loop.best.save(step, loop.first, loop.last, self.tracker.state())
        return evaluation
