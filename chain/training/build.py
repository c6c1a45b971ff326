"""From a config to a ready `Run`: prepare once, apply the placement, load the data, build the strategy.

Everything that needs no TensorFlow runtime (every config error, the data set's description,
the placement with its per-replica batch, the memory estimate) is settled by the preparation
pass, `chain.spec.prepare`, into one `RunSpec`; this module reads it. What needs the runtime
is done here, in `apply`, before anything is built, printed or written: the logical devices
configured, the devices the plan uses checked to exist, a multi-worker run's strategy made.
Data only TensorFlow reads (TFRecord files, the user's function) is checked once loaded
(`chain.spec.with_data`).
"""

from __future__ import annotations

from typing import Callable, Sequence

from omegaconf import DictConfig

from chain import data
from chain.config import Settings
from chain.data import stream_shares
from chain.planning import cluster, devices, fit, planner
from chain.spec import RunSpec, prepare, with_data
from chain.training import ways
from chain.training.run import Run


def apply(spec: RunSpec) -> None:
    """Apply the placement to TensorFlow (its logical devices, before the runtime starts) and check
    that every device the plan uses exists; a multi-worker run checks its peers and makes its
    strategy instead (before anything starts the runtime)."""
    settings, placement = spec.settings, spec.placement
    if placement.multi_worker:
        cluster.check_peers(placement.multi_worker, placement.task, settings.cluster.lost_after_s)
        cluster.multi_worker_strategy()
        return
    late = None if devices.configure(placement, settings.placement) else placement.kind
    if placement.strategy == planner.MIRRORED:
        placement.replicas = devices.check_devices(placement.replicas, given=False, role="replica", late=late)
    elif placement.strategy == planner.REPLICATED:  # every copy's devices; replica 0's are `devices`
        k = len(placement.devices)
        flat = devices.check_devices([d for row in placement.grid for d in row], given=False, role="replica stage",
                                     late=late)
        placement.grid = [flat[r * k:(r + 1) * k] for r in range(len(placement.grid))]
        placement.devices = list(placement.grid[0])
    else:
        given = settings.placement.devices  # checked as the user wrote them, so errors quote them
        placement.devices = devices.check_devices(given or placement.devices, given=bool(given), late=late)


def setup(cfgs: Sequence[RunSpec | Settings | DictConfig | dict]) -> None:
    """Configure TensorFlow's logical devices now for every config this process will build (see
    `chain.setup`): the plan using the most devices is applied, and every plan is then checked
    against the devices that exist (the others reuse them, each stage still on its own device).
    A multi-worker run's devices are its hosts': nothing to set up here."""
    specs = [prepare(c) for c in cfgs]
    local = [s for s in specs if not s.placement.multi_worker]
    for spec in sorted(local, key=lambda s: devices.count(s.placement), reverse=True):
        apply(spec)


def build(cfg: RunSpec | Settings | DictConfig | dict, run_dir: str | None = None, *,
          stages: Sequence[Callable] | None = None, model=None) -> Run:
    """Prepare (unless given a prepared `RunSpec`), apply the placement and build a run (see `chain.build`)."""
    import keras

    from chain.training import compiled_clipping
    from chain.training.user_bodies import resolve

    spec = prepare(cfg)
    apply(spec)
    settings = spec.settings
    keras.utils.set_random_seed(settings.seed)  # the user's function may draw random numbers
    dataset = data.load(settings.data, settings.seed, spec.data_info)
    spec = with_data(spec, dataset.info)
    settings, placement = spec.settings, spec.placement
    if dataset.shards is not None and placement.strategy == planner.MIRRORED:  # each replica streams its own files
        stream_shares.check_files(dataset.shards, len(placement.replicas), getattr(settings.data, "files", None))
    keras.utils.set_random_seed(settings.seed)  # weights start the same whatever reading the data drew
    bodies, labels = resolve(settings, placement, dataset.info, stages, model)
    if bodies is not None and spec.inventory is not None:  # a cut model's stages are estimated once it is cut
        fit.check(placement, placement.footprints, spec.inventory)
    settings = compiled_clipping.honour(settings, model, placement.notes)  # a compiled model's clipping is kept
    strategy = ways.create(settings, placement, dataset.info, bodies=bodies, labels=labels)
    run = Run(settings, strategy, dataset, run_dir)
    if placement.cluster:  # the workers serve on after the run: watched as long as this process lives
        cluster.Watchdog(placement.cluster, settings.cluster.lost_after_s, run.intact).start()
    elif placement.multi_worker:  # every host ends its own run: its peers are watched while it trains
        run.watchdog = cluster.Watchdog(placement.multi_worker, settings.cluster.lost_after_s, run.intact,
                                        skip=placement.task)
        run.watchdog.start()
    return run
