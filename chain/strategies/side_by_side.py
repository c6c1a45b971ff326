"""mode=side_by_side: several independent models trained in one process on one shared data stream.

Each variant (`chain.config.variants`) is one model: the stage template with its overrides,
its own optimizer, its own device (the planner's rules, or shared ones by
`placement.devices`), its own checkpoint and TensorBoard directory (`stage_NN`). Every model
sees the same batches, read and preprocessed once; a model with its own `data.batch_size`
takes the first that many examples of each shared batch; a paused model is kept and
checkpointed, not trained.

Policies (`side_by_side.policy`): `lockstep`, every model's step in one compiled step, so
models on different devices run at once; `round_robin`, one compiled step per model, called
in turn, so only one model's activations are alive at a time.

Out of memory (`tf.errors.ResourceExhaustedError`) in a step does not end the run: the step
changed no model (lockstep updates wait for every model's gradients; round robin retries
from the model that ran out), the batch of the models on the device that ran out shrinks
by `oom.shrink`, the step is rebuilt and the same batch tried again; each event is logged
and recorded in summary.json. Below `oom.min_batch_size` the run stops with one line.
"""

from __future__ import annotations

import logging
import math
import re
from dataclasses import replace
from typing import Any, Callable

import numpy as np
import tensorflow as tf

from chain import testhooks
from chain.config.checks import BatchCut
from chain.config.schema import Settings
from chain.data.catalog import DataInfo
from chain.errors import OutOfMemory
from chain.planning.devices import canonical
from chain.planning.planner import Assignment
from chain.records.results import LossRecord
from chain.records.summaries import OomEvent, Ranked, SideBySideFields, StageSummary, Summary, VariantFields
from chain.steps.evaluate import validation_loss
from chain.steps.independent import lockstep_step, model_step
from chain.strategies.base import Strategy
from chain.strategies.objectives import Objective

log = logging.getLogger("chain")
SIDE_BY_SIDE = "side_by_side"


class SideBySide(Strategy):
    """Independent models on one data stream (see the module docstring): the distribution of
    mode=side_by_side, whose objective (`chain.strategies.objectives.Independent`) gives each model
    its own head and loss, every model taking the data."""

    name = SIDE_BY_SIDE
    title = "SideBySide"
    # One step per call under both policies: the out-of-memory backoff needs each step's boundary
    # (a step that ran out changed no model; inside a loop of N steps, the steps before it would have).
    steps_in_one_call = False

    def __init__(
        self,
        settings: Settings,
        assignment: Assignment,
        info: DataInfo,
        batch_cut: BatchCut,
        learns: type[Objective],
        **bodies: Any,
    ):
        self.variants = settings.variants
        self.batch_sizes = [v.batch_size for v in self.variants]
        self.paused = [v.paused for v in self.variants]
        self.oom_events: list[OomEvent] = []
        self.attempts = 0  # steps tried in this process (the test hook's clock)
        self._pending: list | None = None  # round robin: the models that finished the step in progress
        super().__init__(settings, assignment, info, batch_cut, learns, **bodies)
        for st, v in zip(self.stages, self.variants):  # the placement table names each model
            st.label = f"{v.name}: {st.describe()}" + (" (paused)" if v.paused else "")
        self.round_robin = settings.side_by_side.policy == "round_robin"
        self._models: list[Callable | None] = self._model_steps()

    def make_step(self) -> Callable:
        return lockstep_step(self.stages, self.batch_sizes, self.paused, self.settings.trainer.jit_compile)

    def _model_steps(self) -> list[Callable | None]:
        jit = self.settings.trainer.jit_compile
        return [
            None if p else tf.function(model_step(s, b, jit), autograph=False)
            for s, b, p in zip(self.stages, self.batch_sizes, self.paused)
        ]

    def call(self, x: Any, ys: dict[str, Any]) -> Any:
        while True:
            try:
                testhooks.before_step(self.attempts + 1)
                row = self._round(x, ys) if self.round_robin else super().call(x, ys)
                self.attempts += 1
                return row
            except tf.errors.ResourceExhaustedError as e:
                self._back_off(e)

    def _round(self, x: Any, ys: dict[str, Any]) -> Any:
        """Round robin: each model's step in turn; after an out-of-memory retry, only those still to go."""
        args = self.arguments(x, ys)
        values = self._pending or [None] * len(self.stages)
        for k, fn in enumerate(self._models):
            if values[k] is None:
                values[k] = np.array([math.nan, 0.0], np.float32) if fn is None else fn(*args).numpy()
                self._pending = values
        self._pending = None
        return np.concatenate(values)

    def _back_off(self, e: tf.errors.ResourceExhaustedError) -> None:
        """Shrink the batch of the models on the device that ran out, rebuild the steps, or stop."""
        found = re.search(r"(/job:[^ ]*)?/device:[A-Za-z]+:\d+", e.message or "")
        device = canonical(found.group(0)) if found else None
        victims = [
            k
            for k, s in enumerate(self.stages)
            if not self.paused[k] and (device is None or canonical(s.device) == device)
        ]
        step = self.attempts + 1
        where = device or "a device"
        smaller = {k: math.floor(self.batch_sizes[k] * self.settings.oom.shrink) for k in victims}
        floor = self.settings.oom.min_batch_size
        if not victims or min(smaller.values()) < floor:
            names = ", ".join(f"{self.variants[k].name} ({self.batch_sizes[k]})" for k in victims) or "none"
            raise OutOfMemory(
                f"out of memory on {where} at step {step} with the smallest batches allowed: "
                f"{names}; shrinking by oom.shrink={self.settings.oom.shrink:g} would go below "
                f"oom.min_batch_size={floor}"
            )
        changes = {self.variants[k].name: [self.batch_sizes[k], smaller[k]] for k in victims}
        log.warning(
            "out of memory on %s at step %d: batch %s; the step changed no model and is tried again",
            where,
            step,
            ", ".join(f"{n} {a} -> {b}" for n, (a, b) in changes.items()),
        )
        self.oom_events.append(OomEvent(step, device, changes))
        for k in victims:
            self.batch_sizes[k] = smaller[k]
        self.set_step(self.make_step())  # new slice sizes: new shapes, new traces
        self._models = self._model_steps()

    def stage_summary(self, stage, entry: StageSummary, first: LossRecord, last: LossRecord) -> StageSummary:
        v = self.variants[stage.index]
        variant = VariantFields(v.name, dict(v.overrides), self.batch_sizes[stage.index], v.paused)
        return replace(super().stage_summary(stage, entry, first, last), variant=variant)

    def summary(self, summary: Summary) -> Summary:
        fields = SideBySideFields(self.settings.side_by_side.policy, self.oom_events, None)
        return replace(super().summary(summary), side_by_side=fields)

    def complete(self, summary: Summary) -> Summary:
        """Rank the variants: by the last validation loss when there is one, else by the last training loss."""

        def val_loss(st: StageSummary) -> float | None:
            return validation_loss(st.val)

        def score(st: StageSummary) -> float:
            val = val_loss(st)
            value = val if val is not None else st.own.loss_last
            return math.inf if value is None or st.variant.paused else value

        ranked = sorted(summary.stages, key=score)
        ranking = [
            Ranked(
                i + 1,
                st.variant.variant,
                st.variant.overrides,
                "val_loss" if val_loss(st) is not None else "loss_last",
                None if score(st) == math.inf else score(st),
                summary.steps_per_second,
                st.peak_memory_bytes,
                st.variant.paused,
            )
            for i, st in enumerate(ranked)
        ]
        return replace(summary, side_by_side=replace(summary.side_by_side, ranking=ranking))
