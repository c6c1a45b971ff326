"""The ways of training: which distribution, given which objective, trains a (topology, mode) pair.

| `Assignment.topology` | mode=local (`LocalObjective`) | mode=e2e (`ChainObjective`) |
|---|---|---|
| `pipeline` (a device per stage) | `DevicePerStage` | `Scheduled` (a pipeline schedule) |
| `mirrored` (every stage on every replica) | `Mirrored` | `Mirrored` |
| `pipeline_replicas` (copies of the pipeline) | - | `Replicated` |

and mode=side_by_side (independent models, a device each or shared): `SideBySide` with the
`Independent` objective.

The table imports every distribution, `chain.pipeline.strategy.Scheduled` included, so it
lives above both `chain.strategies` and `chain.pipeline` (docs/architecture.md, the layers).
A new way of training is a row here: an objective (`chain.strategies.objectives`) given to a
distribution (in `chain.strategies`, or `chain.pipeline` for one that runs a schedule), either
of them reused where one fits, and its keys in the config schema.
"""

from __future__ import annotations

from dataclasses import dataclass

from chain.config.checks import BatchCut
from chain.config.schema import Settings
from chain.data.catalog import DataInfo
from chain.pipeline.replicas import Replicated
from chain.schedule.schedules import Schedule
from chain.pipeline.strategy import Scheduled
from chain.planning.planner import MIRRORED, PIPELINE, REPLICATED, Assignment
from chain.strategies.base import Strategy
from chain.strategies.mirrored import Mirrored
from chain.strategies.objectives import ChainObjective, Independent, LocalObjective, Objective
from chain.strategies.device_per_stage import DevicePerStage
from chain.strategies.side_by_side import SideBySide


@dataclass(frozen=True)
class Way:
    """One way of training: a distribution (where the stages live, how a batch becomes an update)
    given an objective (what is learned)."""

    distribution: type[Strategy]
    objective: type[Objective]


TABLE: dict[tuple[str, str], Way] = {
    (PIPELINE, "local"): Way(DevicePerStage, LocalObjective),
    (PIPELINE, "e2e"): Way(Scheduled, ChainObjective),
    (MIRRORED, "local"): Way(Mirrored, LocalObjective),
    (MIRRORED, "e2e"): Way(Mirrored, ChainObjective),
    (PIPELINE, "side_by_side"): Way(SideBySide, Independent),
    (REPLICATED, "e2e"): Way(Replicated, ChainObjective),
}


def for_mode(mode: str, topology: str = PIPELINE) -> Way:
    """The way that trains `mode` on an assignment's `topology` (pipeline: a device per stage); its
    objective's `heads` and `readout` say what its stages are built with."""
    return TABLE[(topology, mode)]


def create(
    settings: Settings,
    assignment: Assignment,
    info: DataInfo,
    batch_cut: BatchCut,
    schedule: Schedule | None = None,
    **bodies,
) -> Strategy:
    """The strategy for this placement and mode, with its stages built and its step compiled.

    `schedule`: the run's pipeline schedule (`RunSpec.schedule`, built once by the preparation pass),
    which the distributions that run one (`Scheduled` and its copies) are given.
    `bodies`: `bodies=` and `labels=` for stages not built from the config (`chain.stages.bodies`).
    """
    way = for_mode(settings.mode, assignment.topology)
    if issubclass(way.distribution, Scheduled):
        if schedule is None:
            name = f"{way.distribution.title}{way.objective.title}"
            raise ValueError(f"{name} runs a pipeline schedule: give the RunSpec's (chain.prepared.prepare)")
        return way.distribution(settings, assignment, info, batch_cut, way.objective, schedule, **bodies)
    return way.distribution(settings, assignment, info, batch_cut, way.objective, **bodies)
