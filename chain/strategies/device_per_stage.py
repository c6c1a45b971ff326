"""The `DevicePerStage` distribution: each stage on its own device, each learning on its own.

Stage k lives on `placement.devices[k]`; one `tf.function` per step runs every stage on its own
head and loss, activations passed forward with their gradient stopped (`chain.steps.local`):
mode=local's `LocalObjective`. The chain's objective on a device per stage runs a pipeline
schedule instead, the `Scheduled` distribution of `chain.pipeline.strategy`.
"""

from __future__ import annotations

from typing import Callable

from chain.planning.planner import PIPELINE
from chain.steps.local import local_step
from chain.strategies.base import Strategy


class DevicePerStage(Strategy):
    """Stage k on `placement.devices[k]`; data crosses devices only through explicit copies."""

    name = PIPELINE
    title = "DevicePerStage"

    def make_step(self) -> Callable:
        t = self.settings.trainer
        return local_step(self.stages, t.grad_accum, t.jit_compile)
