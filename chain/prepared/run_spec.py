"""`RunSpec`: what a run is, settled once before TensorFlow's runtime starts, by the preparation
pass (`chain.prepared.preparation`); the build (`chain.training.build`) reads it and nothing else."""

from __future__ import annotations

from dataclasses import dataclass

from chain.config import Settings
from chain.config.checks import BatchCut
from chain.records.auto_plan import AutoPlan
from chain.data.catalog import DataInfo
from chain.schedule.schedules import Schedule
from chain.planning.inventory import Inventory
from chain.planning.planner import Assignment


@dataclass(frozen=True)
class RunSpec:
    """The settings, checked; the data set's description (`data_info`; None until the data is read
    when only TensorFlow reads it: TFRecord files, the user's function); and where every stage runs
    (`assignment`) on which machine (`inventory`), and how each step's batch cuts over the replicas
    planned and into microbatches (`batch_cut`). `assignment`, `inventory` and `batch_cut` are None
    for a spec of `chain.prepared.check_config`, which plans nothing.
    `schedule`: mode=e2e's pipeline schedule (`pipeline.schedule`, built or read once here: the
    planning, the memory estimate and the strategy read it); None in the other modes."""

    settings: Settings
    data_info: DataInfo | None
    assignment: Assignment | None = None
    inventory: Inventory | None = None
    schedule: Schedule | None = None
    batch_cut: BatchCut | None = None
    auto_plan: AutoPlan | None = None  # placement.plan=auto: what the search chose (chain.autoplan)
