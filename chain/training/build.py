"""From a config to a ready `Run`: validate once, plan the devices, build the strategy.

Everything that needs TensorFlow's runtime (which devices exist, how a mirrored run's
replicas divide the batch) is checked here, in `plan`, before anything is printed or
written; everything else was checked by `chain.config.validate`.
"""

from __future__ import annotations

from omegaconf import DictConfig

from chain import data, strategies
from chain.config import Settings, validate
from chain.planning import devices, planner
from chain.planning.inventory import discover
from chain.training.run import Run


def plan(settings: Settings) -> planner.Placement:
    """Plan the devices for `settings`, configure TensorFlow's logical devices (before its
    runtime starts) and check that every device the plan uses exists."""
    placement = planner.plan(settings.placement, len(settings.stages), discover())
    planner.check_batch(settings.data.batch_size, placement)
    devices.configure(placement, settings.placement)
    if placement.strategy == planner.MIRRORED:
        placement.replicas = devices.check_devices(placement.replicas, given=False, role="replica")
    else:
        given = settings.placement.devices  # checked as the user wrote them, so errors quote them
        placement.devices = devices.check_devices(given or placement.devices, given=bool(given))
    return placement


def build(cfg: Settings | DictConfig | dict, run_dir: str | None = None) -> Run:
    """Validate (unless given `Settings`), plan and build a run (see `chain.build`)."""
    import keras

    settings = validate(cfg)
    placement = plan(settings)
    keras.utils.set_random_seed(settings.seed)
    dataset = data.load(settings.data, settings.seed)
    strategy = strategies.create(settings, placement, dataset.info)
    return Run(settings, strategy, dataset, run_dir)
