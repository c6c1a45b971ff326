"""From a config to a ready `Run`: validate once, plan the devices, load the data, build the strategy.

Everything that needs to know the machine (which devices exist, how a mirrored run's
replicas divide the batch, whether the chain's estimated memory fits) is checked here,
in `plan`, before anything is built, printed or written; so is, once loaded, data that
only TensorFlow can read (TFRecord files, the user's function: `chain.config.checks.with_data`).
Everything else was checked by `chain.config.validate`.
"""

from __future__ import annotations

from typing import Callable, Sequence

from omegaconf import DictConfig

from chain import data
from chain.config import Settings, validate
from chain.config.checks import with_data
from chain.config.shapes import memory_bytes, stage_shapes
from chain.data.catalog import DataInfo, describe
from chain.errors import ConfigError
from chain.planning import cluster, devices, planner
from chain.planning.inventory import Inventory, discover, host_memory_mb
from chain.training import ways
from chain.training.run import Run


def check_memory(settings: Settings, placement: planner.Placement, info: DataInfo, inventory: Inventory) -> None:
    """Refuse a chain whose estimated memory does not fit the devices it is placed on."""
    per_replica = planner.check_batch(settings.data.batch_size, placement)
    shapes = stage_shapes(settings.stages, info, settings.mode)
    need = [memory_bytes(shape, spec.optim, per_replica) if shape else 0  # a user's body: known once built
            for shape, spec in zip(shapes, settings.stages)]
    planner.check_memory(placement, need, inventory, settings.placement.cpu_memory_mb, host_memory_mb())


def plan(settings: Settings, info: DataInfo | None = None) -> tuple[planner.Placement, Inventory]:
    """Plan the devices for `settings`, configure TensorFlow's logical devices (before its
    runtime starts) and check that every device the plan uses exists; returns the placement
    and the inventory it was planned on. With cluster workers, connect to them first (each
    must answer) and plan over their devices. The memory estimate is checked here when the
    data is described (`info`), else by `build` once it is loaded."""
    multi_worker = cluster.task()
    if multi_worker:
        if settings.cluster.workers:
            raise ConfigError("cluster.workers makes this process a client of workers, but TF_CONFIG names it a worker "
                              "(its task); give one or the other")
        inventory = discover()
        placement = planner.plan_multi_worker(settings.placement, len(settings.stages), *multi_worker, inventory.gpus)
        planner.check_batch(settings.data.batch_size, placement)
        if info is not None:
            check_memory(settings, placement, info, inventory)
        cluster.check_peers(*multi_worker, settings.cluster.lost_after_s)
        cluster.multi_worker_strategy()  # before anything starts the runtime
        return placement, inventory
    addresses = cluster.workers(settings.cluster.workers)
    if addresses:
        cluster.check_reachable(addresses, settings.cluster.lost_after_s)
        cluster.connect(addresses)
        inventory = Inventory()
        placement = planner.plan_cluster(settings.placement, len(settings.stages),
                                         cluster.remote_devices(len(addresses)), addresses)
    else:
        inventory = discover()
        placement = planner.plan(settings.placement, len(settings.stages), inventory)
    planner.check_batch(settings.data.batch_size, placement, settings.pipeline.microbatches)
    if info is not None:
        check_memory(settings, placement, info, inventory)
    devices.configure(placement, settings.placement)
    if placement.strategy == planner.MIRRORED:
        placement.replicas = devices.check_devices(placement.replicas, given=False, role="replica")
    elif placement.strategy == planner.REPLICATED:  # every copy's devices; replica 0's are `devices`
        k = len(placement.devices)
        flat = devices.check_devices([d for row in placement.grid for d in row], given=False, role="replica stage")
        placement.grid = [flat[r * k:(r + 1) * k] for r in range(len(placement.grid))]
        placement.devices = list(placement.grid[0])
    else:
        given = settings.placement.devices  # checked as the user wrote them, so errors quote them
        placement.devices = devices.check_devices(given or placement.devices, given=bool(given))
    return placement, inventory


def build(cfg: Settings | DictConfig | dict, run_dir: str | None = None, *, stages: Sequence[Callable] | None = None,
          model=None) -> Run:
    """Validate (unless given `Settings`), plan and build a run (see `chain.build`)."""
    import keras

    from chain.training.user_bodies import resolve

    settings = validate(cfg)
    info = describe(settings.data)  # None: only TensorFlow reads it, once the devices are configured
    placement, inventory = plan(settings, info)
    keras.utils.set_random_seed(settings.seed)  # the user's function may draw random numbers
    dataset = data.load(settings.data, settings.seed)
    settings = with_data(settings, dataset.info)
    if info is None:
        check_memory(settings, placement, dataset.info, inventory)
    keras.utils.set_random_seed(settings.seed)  # weights start the same whatever reading the data drew
    bodies, labels = resolve(settings, placement, dataset.info, stages, model)
    strategy = ways.create(settings, placement, dataset.info, bodies=bodies, labels=labels)
    run = Run(settings, strategy, dataset, run_dir)
    if placement.cluster:  # the workers serve on after the run: watched as long as this process lives
        cluster.Watchdog(placement.cluster, settings.cluster.lost_after_s, run.intact).start()
    elif placement.multi_worker:  # every host ends its own run: its peers are watched while it trains
        run.watchdog = cluster.Watchdog(placement.multi_worker, settings.cluster.lost_after_s, run.intact,
                                        skip=placement.task)
        run.watchdog.start()
    return run
