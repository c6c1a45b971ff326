"""From a config to a ready `Run`: validate once, plan the devices, build the strategy.

Everything that needs to know the machine (which devices exist, how a mirrored run's
replicas divide the batch, whether the chain's estimated memory fits) is checked here,
in `plan`, before anything is built, printed or written; everything else was checked by
`chain.config.validate`.
"""

from __future__ import annotations

from typing import Callable, Sequence

from omegaconf import DictConfig

from chain import data, strategies
from chain.config import Settings, validate
from chain.config.shapes import memory_bytes, stage_shapes
from chain.data.catalog import describe
from chain.planning import cluster, devices, planner
from chain.planning.inventory import Inventory, discover, host_memory_mb
from chain.training.run import Run


def plan(settings: Settings) -> planner.Placement:
    """Plan the devices for `settings`, configure TensorFlow's logical devices (before its
    runtime starts) and check that every device the plan uses exists. With cluster workers,
    connect to them first (each must answer) and plan over their devices."""
    addresses = cluster.workers(settings.cluster.workers)
    if addresses:
        cluster.check_reachable(addresses)
        cluster.connect(addresses)
        inventory = Inventory()
        placement = planner.plan_cluster(settings.placement, len(settings.stages),
                                         cluster.remote_devices(len(addresses)), addresses)
    else:
        inventory = discover()
        placement = planner.plan(settings.placement, len(settings.stages), inventory)
    per_replica = planner.check_batch(settings.data.batch_size, placement)
    shapes = stage_shapes(settings.stages, describe(settings.data), settings.mode)
    need = [memory_bytes(shape, spec.optim, per_replica) if shape else 0  # a user's body: known once built
            for shape, spec in zip(shapes, settings.stages)]
    planner.check_memory(placement, need, inventory, settings.placement.cpu_memory_mb, host_memory_mb())
    devices.configure(placement, settings.placement)
    if placement.strategy == planner.MIRRORED:
        placement.replicas = devices.check_devices(placement.replicas, given=False, role="replica")
    else:
        given = settings.placement.devices  # checked as the user wrote them, so errors quote them
        placement.devices = devices.check_devices(given or placement.devices, given=bool(given))
    return placement


def build(cfg: Settings | DictConfig | dict, run_dir: str | None = None, *, stages: Sequence[Callable] | None = None,
          model=None) -> Run:
    """Validate (unless given `Settings`), plan and build a run (see `chain.build`)."""
    import keras

    from chain.training.bodies import resolve

    settings = validate(cfg)
    placement = plan(settings)
    keras.utils.set_random_seed(settings.seed)
    dataset = data.load(settings.data, settings.seed)
    bodies, labels = resolve(settings, placement, dataset.info, stages, model)
    strategy = strategies.create(settings, placement, dataset.info, bodies=bodies, labels=labels)
    run = Run(settings, strategy, dataset, run_dir)
    if placement.cluster:
        cluster.Watchdog(placement.cluster, settings.cluster.lost_after_s, run.intact).start()
    return run
