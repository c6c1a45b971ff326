"""The ways of training: which strategy class trains a (placement layout, mode) pair.

| `placement.layout` | mode=local | mode=e2e |
|---|---|---|
| `pipeline` (a device per stage) | `PipelinedLocal` | `PipelinedChain` |
| `mirrored` (every stage on every replica) | `MirroredLocal` | `MirroredChain` |
| `pipeline_replicas` (copies of the pipeline) | - | `ReplicatedChain` |

and mode=side_by_side (independent models, a device each or shared): `SideBySide`.

The table imports every strategy, `chain.pipeline.strategy.PipelinedChain` included, so it
lives above both `chain.strategies` and `chain.pipeline` (docs/architecture.md, the layers).
A new way of training is a class (in `chain.strategies`, or `chain.pipeline` for a schedule's
strategy), a row here, and its keys in the config schema.
"""

from __future__ import annotations

from chain.config.checks import BatchCut
from chain.config.schema import Settings
from chain.data.catalog import DataInfo
from chain.pipeline.replicas import ReplicatedChain
from chain.schedule.schedules import Schedule
from chain.pipeline.strategy import PipelinedChain
from chain.planning.planner import MIRRORED, PIPELINE, REPLICATED, Placement
from chain.strategies.base import Strategy
from chain.strategies.mirrored import MirroredChain, MirroredLocal
from chain.strategies.pipelined import PipelinedLocal
from chain.strategies.side_by_side import SideBySide

TABLE: dict[tuple[str, str], type[Strategy]] = {
    (PIPELINE, "local"): PipelinedLocal,
    (PIPELINE, "e2e"): PipelinedChain,
    (MIRRORED, "local"): MirroredLocal,
    (MIRRORED, "e2e"): MirroredChain,
    (PIPELINE, "side_by_side"): SideBySide,
    (REPLICATED, "e2e"): ReplicatedChain,
}


def for_mode(mode: str, layout: str = PIPELINE) -> type[Strategy]:
    """The strategy class that trains `mode` on a placement's `layout` (pipeline: a device per
    stage); its `heads` and `readout` say what its stages are built with."""
    return TABLE[(layout, mode)]


def create(settings: Settings, placement: Placement, info: DataInfo, batch_cut: BatchCut,
           schedule: Schedule | None = None, **bodies) -> Strategy:
    """The strategy for this placement and mode, with its stages built and its step compiled.

    `batch_cut`: how a batch cuts over the replicas and into microbatches (`RunSpec.batch_cut`);
    `schedule`: the run's pipeline schedule (`RunSpec.schedule`); both worked out once by the
    preparation pass. The strategies that run a schedule (`PipelinedChain` and its copies) are given it.
    `bodies`: `bodies=` and `labels=` for stages not built from the config (`chain.stages.bodies`).
    """
    cls = for_mode(settings.mode, placement.layout)
    if issubclass(cls, PipelinedChain):
        if schedule is None:
            raise ValueError(f"{cls.__name__} runs a pipeline schedule: give the RunSpec's (chain.prepared.prepare)")
        return cls(settings, placement, info, batch_cut, schedule, **bodies)
    return cls(settings, placement, info, batch_cut, **bodies)
