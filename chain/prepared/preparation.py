"""The preparation pass: from a config to a `RunSpec`, every check that needs no TensorFlow done
once, in order, before anything starts TensorFlow's runtime.

1. `check_config(cfg)`: the settings (`chain.config.validate_and_describe`: every key, every rule between keys, the data
   set described once and the settings checked against it). Imports no TensorFlow: the
   command line runs it before Hydra writes anything.
   mode=e2e's schedule is built (or its file read) here, once (`chain.config.schedule_choice`), and kept
   on the `RunSpec`.
2. `prepare(cfg)`: `check_config`, then the devices planned (the machine's inventory, the planner's
   rules), how a batch cuts over the replicas planned (`RunSpec.batch_cut`, once), the memory estimate
   when the data is described. Planning asks
   TensorFlow how many GPUs there are (without starting its runtime), and a cluster's placement
   needs the devices its workers report, so `prepare` connects to them first.
3. `with_loaded_data(spec, info)`: data only TensorFlow reads, checked once loaded (the same checks as
   1 and 2 make for the rest).

What needs the runtime (logical devices configured, the devices that exist) is
`chain.training.build`'s, after `prepare`.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from chain import config
from chain.config import Settings, checks, schedule_choice
from chain.config.checks import BatchCut
from chain.data import sources
from chain.data.catalog import DataInfo
from chain.errors import ConfigError
from chain.schedule.schedules import rows_rule
from chain.planning import cluster, fit, planner
from chain.planning.inventory import Inventory, discover, host_memory_mb
from chain.planning.planner import Assignment
from chain.prepared import estimate
from chain.prepared.run_spec import RunSpec


def check_config(cfg: Any) -> RunSpec:
    """A config (a composed `DictConfig`, a dict, `Settings` or a `RunSpec`) checked without
    TensorFlow: a `RunSpec` without a placement. One `ConfigError` line for the first problem.

    `Settings` were checked when made (`chain.config.validate`); their data set is described here
    (the files it reads are kept per version of the file: not read again)."""
    if isinstance(cfg, RunSpec):  # checked; one made by hand may lack its schedule
        if cfg.schedule is not None or cfg.settings.mode != "e2e":
            return cfg
        return replace(cfg, schedule=schedule_choice.check_pipeline(cfg.settings))
    if isinstance(cfg, Settings):
        settings, info = cfg, sources.describe(cfg.data)
    else:
        settings, info = config.validate_and_describe(cfg)
    # the schedule can run (a schedule file read and checked), built here once: what follows reads it
    schedule = schedule_choice.check_pipeline(settings) if settings.mode == "e2e" else None
    return RunSpec(settings, info, schedule=schedule)


def prepare(cfg: Any, inventory: Inventory | None = None) -> RunSpec:
    """`check_config(cfg)`, then the placement planned on `inventory` (None: this machine's, or the
    cluster's workers), how a batch cuts over it (`RunSpec.batch_cut`), and the memory estimate checked when the data
    is described. A `RunSpec` that has a placement is returned as it is."""
    spec = check_config(cfg)
    if spec.assignment is not None:
        return spec
    s = spec.settings
    multi_worker = cluster.task()
    if multi_worker:
        if s.cluster.workers:
            raise ConfigError(
                "cluster.workers makes this process a client of workers, but TF_CONFIG names it a worker "
                "(its task); give one or the other"
            )
        inventory = inventory or discover()
        assignment = planner.assign_multi_worker(s.placement, len(s.stages), *multi_worker, inventory.gpus)
    else:
        n_stages = len(s.stages)
        shared = None if s.placement.devices or s.mode != "e2e" else schedule_choice.shared_devices(spec.schedule)
        n = shared or n_stages  # stages sharing devices: plan their D devices, then put each stage on its own
        addresses = cluster.workers(s.cluster)
        if addresses:
            scheduled = cluster.client_address(s.cluster) is not None  # its workers start with it
            cluster.check_reachable(addresses, s.cluster.lost_after_s, wait=s.cluster.wait_s if scheduled else 0.0)
            cluster.connect(addresses)  # the workers' devices are known only through TensorFlow
            inventory = Inventory()
            assignment = planner.assign_cluster(s.placement, n, cluster.remote_devices(len(addresses)), addresses)
        else:
            inventory = inventory or discover()
            assignment = planner.assign(s.placement, n, inventory, side_by_side=s.mode == "side_by_side")
        if shared:  # stage k on the device of its row of the schedule
            assignment = planner.shared(
                assignment, spec.schedule.stage_rows, s.pipeline.schedule, rows_rule(spec.schedule)
            )
    if assignment.topology == planner.MIRRORED:  # each replica streams its own files
        checks.mirrored_stream(s.data)
    cut = cut_batch(s.data.batch_size, assignment, s.pipeline.microbatches if s.mode == "e2e" else 1)  # once
    spec = replace(spec, assignment=assignment, inventory=inventory, batch_cut=cut)
    if spec.data_info is not None:
        spec = with_footprints(spec)
    return spec


def cut_batch(batch_size: int, assignment: Assignment, microbatches: int = 1) -> BatchCut:
    """How `batch_size` (`data.batch_size`, the global batch) cuts over the replicas `assignment` planned
    (mirrored replicas, or copies of a pipeline) and, on a pipeline, into `microbatches` (mode=e2e's; a
    mirrored replica runs its share whole): `chain.config.checks.batch_cut`'s rule and line, for the
    replicas planned (`placement.replicas=auto` is known only here)."""
    if assignment.topology == planner.MIRRORED:
        return checks.batch_cut(batch_size, len(assignment.mirrored_devices), mirrored=True)
    return checks.batch_cut(batch_size, len(assignment.copies) or 1, microbatches)


def with_loaded_data(spec: RunSpec, info: DataInfo) -> RunSpec:
    """`spec` for data described only once read (`spec.data_info` None): its settings checked
    against `info` (`chain.config.checks.settle_loaded_data`) and its memory estimate. A spec whose data was
    described is returned as it is: it was checked."""
    if spec.data_info is not None:
        return spec
    spec = replace(spec, settings=checks.settle_loaded_data(spec.settings, info), data_info=info)
    return with_footprints(spec)


def with_footprints(spec: RunSpec) -> RunSpec:
    """`spec` with each stage's estimated peak on its placement (`placement.footprints`, what
    plan_only=true shows and summary.json records), after refusing a chain whose estimate does not
    fit the devices it is placed on: a device of known memory (`chain.planning.fit`), the host's
    memory on CPU."""
    s = spec.settings
    footprints = tuple(estimate.footprints(s, spec.data_info, spec.assignment, spec.batch_cut, spec.schedule))
    assignment = replace(spec.assignment, footprints=footprints)
    if any(f is not None for f in footprints) and s.placement.plan != "auto":  # plan=auto's search drops those itself
        fit.check_stages_fit(
            assignment,
            footprints,
            spec.inventory,
            lambda: estimate.alternatives(s, spec.data_info, assignment, spec.batch_cut, spec.schedule),
        )
    need = [f.total if f else 0 for f in footprints]  # a user's body: known once built
    planner.check_memory(assignment, need, spec.inventory, s.placement.cpu_memory_mb, host_memory_mb())
    return replace(spec, assignment=assignment)
