"""Pipelined strategies: each stage on its own device, one `tf.function` per step.

`Pipelined` is the distribution (stage k on `placement.devices[k]`); `PipelinedLocal`
(mode=local) runs every stage on its own head and loss, activations passed forward
(`chain.steps.local`). Its mode=e2e sibling, `PipelinedChain`, runs a pipeline schedule and
lives with the schedules in `chain.pipeline.strategy`.
"""

from __future__ import annotations

from typing import Callable

from chain.planning.planner import PIPELINE
from chain.steps.local import local_step
from chain.strategies.base import LocalObjective, Strategy


class Pipelined(Strategy):
    """Stage k on `placement.devices[k]`; data crosses devices only through explicit copies."""

    name = PIPELINE


class PipelinedLocal(LocalObjective, Pipelined):
    """mode=local, pipelined: each stage learns from the previous stage's output, gradient stopped."""

    def make_step(self) -> Callable:
        t = self.settings.trainer
        return local_step(self.stages, t.grad_accum, t.jit_compile)
