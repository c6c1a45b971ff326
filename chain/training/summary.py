"""summary.json as a record: what a finished run reports, built from its strategy, data and loop.

`Run` hands over how the loop ended (`Ending`); `summarize` reads everything else from the
strategy (its stages, assignment, report format and its own sections: `Strategy.summary`,
`stage_summary`), the settings and the data set, and returns the typed `Summary`
(`chain.records.summaries`) before the strategy completes it (`Strategy.complete`) and the
loop adds its measured data wait, profile and, with placement.plan=auto, the plan beside its measured
step (`chain.autoplan.table.plan_fields`).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from chain.config.schema import Settings
from chain.data.loader import Dataset
from chain.planning import memory
from chain.planning.planner import Assignment
from chain.records.results import LossRecord
from chain.records.summaries import ClippingFields, StageSummary, Summary
from chain.stages.stage import Stage
from chain.strategies.base import Strategy
from chain.strategies.objectives import Evaluation


@dataclass(frozen=True)
class Ending:
    """How the loop ended: what summary.json says of the run beyond its strategy and data."""

    steps: int  # the optimizer steps taken (the global step)
    first: LossRecord | None  # the loss record of step 1 (None: no step ran)
    last: LossRecord | None  # the newest step's
    resumed_from: int | None  # the restored step (resume=true), else None
    timed_steps: int  # steps the speed counts (the first call, which traces, left out)
    elapsed: float  # seconds those steps took
    evaluation: Evaluation | None  # the last evaluation (at the end), None without validation data
    best_step: int | None  # the step of the lowest validation loss


def summarize(settings: Settings, strategy: Strategy, dataset: Dataset, ending: Ending) -> Summary:
    """The run's summary, with the strategy's own sections (`Strategy.summary`) filled in."""
    stages, assignment = strategy.stages, strategy.assignment
    skipped = [int(s.skipped.numpy()) for s in stages]
    none = LossRecord(None, [None] * len(stages))
    first, last = ending.first or none, ending.last or none
    evaluation = ending.evaluation
    vals = evaluation.stages if evaluation else []  # mode=local: each stage's own validation metrics
    entries = [
        replace(
            strategy.stage_summary(s, stage_summary(s, skipped[s.index]), first, last),
            model=s.describe(),
            physical=assignment.physical.get(s.device),  # the report's table
            val=vals[s.index] if s.index < len(vals) else None,
            estimated_peak_bytes=estimate(assignment, s.index),
        )
        for s in stages
    ]
    estimates = [st.estimated_peak_bytes for st in entries]
    info = dataset.info
    timed, elapsed = ending.timed_steps, ending.elapsed
    speed = timed and elapsed > 0
    summary = Summary(
        mode=settings.mode,
        strategy=strategy.name,
        steps=ending.steps,
        early_stopped=ending.steps < settings.trainer.steps,
        resumed_from=ending.resumed_from,
        batch_size=settings.data.batch_size,
        grad_accum=settings.trainer.grad_accum,
        examples_per_step=settings.examples_per_step,
        train_examples=info.examples,
        val_examples=info.val_examples,
        precision=settings.precision,
        jit_compile=settings.trainer.jit_compile,
        seed=settings.seed,
        # Every example of every chunk counts: a step is one optimizer update.
        examples_per_second=(timed * settings.examples_per_step / elapsed) if speed else None,
        steps_per_second=timed / elapsed if speed else None,
        data_wait_ms=None,  # the loop's (`chain.training.run`), added after
        loss_first=first.loss,
        loss_last=last.loss,
        clipping=ClippingFields(first.grad_norm, last.grad_norm) if strategy.report_format.norm is not None else None,
        # The last evaluation (at the end): the chain's (mode=e2e; mode=local: per stage).
        val=evaluation.chain if evaluation else None,
        best_step=ending.best_step,
        skipped_steps=sum(skipped),
        peak_memory_scope=memory.scope(strategy.memory_devices()[0]),
        stages=entries,
        skipped_records=dataset.skipped_records,  # data.on_bad_record=skip (this process's)
        traces=dict(strategy.traces),
        # Logical CPUs share one allocator: their one process-wide peak is read against this sum.
        estimated_peak_bytes=sum(estimates) if estimates and None not in estimates else None,
    )
    return strategy.summary(summary)


def estimate(assignment: Assignment, k: int) -> int | None:
    """Stage k's estimated peak memory (`placement.footprints`, the preparation pass's), in bytes."""
    footprints = assignment.footprints
    return footprints[k].total if k < len(footprints) and footprints[k] is not None else None


def stage_summary(s: Stage, skipped: int) -> StageSummary:
    """Stage `s`'s entry in summary.json, before its strategy's and the report's fields."""
    return StageSummary(
        index=s.index,
        device=s.device,
        variable_devices=s.variable_devices(),
        params=s.params,
        peak_memory_bytes=memory.peak_bytes(s.device) if s.device else None,  # None: mirrored
        skipped_steps=skipped,
        # precision=mixed_float16: the stage's loss scale now, and steps skipped for overflow
        # (the same for every stage in mode=e2e, where the chain shares one scale).
        loss_scale=float(s.loss_scale.scale.numpy()) if s.loss_scale is not None else None,
        overflow_steps=int(s.loss_scale.overflows.numpy()) if s.loss_scale is not None else 0,
    )
