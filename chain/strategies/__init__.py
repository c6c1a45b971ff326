"""Strategies: one object per way of training, chosen once from the placement and the mode.

| placement strategy | mode=local | mode=e2e |
|---|---|---|
| `pipeline` (a device per stage) | `PipelinedLocal` | `PipelinedChain` |
| `mirrored` (every stage on every replica) | `MirroredLocal` | `MirroredChain` |

and mode=side_by_side (independent models, a device each or shared): `SideBySide`.

A strategy builds the stages in its scope, compiles the step, splits a batch for it and
reports its own summary fields (`chain.strategies.base.Strategy`). A new way of training
is a new module here, a row of `TABLE`, and its keys in the config schema.
"""

from __future__ import annotations

from chain.config.schema import Settings
from chain.data.catalog import DataInfo
from chain.planning.planner import MIRRORED, PIPELINE, Placement
from chain.strategies.base import Strategy
from chain.strategies.mirrored import MirroredChain, MirroredLocal
from chain.strategies.pipelined import PipelinedChain, PipelinedLocal
from chain.strategies.side_by_side import SideBySide

TABLE: dict[tuple[str, str], type[Strategy]] = {
    (PIPELINE, "local"): PipelinedLocal,
    (PIPELINE, "e2e"): PipelinedChain,
    (MIRRORED, "local"): MirroredLocal,
    (MIRRORED, "e2e"): MirroredChain,
    (PIPELINE, "side_by_side"): SideBySide,
}


def for_mode(mode: str, placement: str = PIPELINE) -> type[Strategy]:
    """The strategy class that trains `mode` on a `placement` strategy (pipeline: a device per
    stage); its `heads` and `readout` say what its stages are built with."""
    return TABLE[(placement, mode)]


def create(settings: Settings, placement: Placement, info: DataInfo, **bodies) -> Strategy:
    """The strategy for this placement and mode, with its stages built and its step compiled.

    `bodies`: `bodies=` and `labels=` for stages not built from the config (`chain.stages.bodies`).
    """
    return for_mode(settings.mode, placement.strategy)(settings, placement, info, **bodies)


__all__ = ["Strategy", "TABLE", "create", "for_mode"]
