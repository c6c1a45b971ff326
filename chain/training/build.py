"""From a config to a ready `Run`: prepare once, apply the placement, load the data, build the strategy.

Everything that needs no TensorFlow runtime (every config error, the data set's description,
the assignment, the schedule, the batch's cut over the replicas, the memory estimate) is settled by the preparation
pass, `chain.prepared.prepare`, into one `RunSpec`; this module reads it. What needs the runtime
is done here, in `apply`, before anything is built, printed or written: the logical devices
configured, the devices the plan uses checked to exist, a multi-worker run's tf.distribute strategy made.
Data only TensorFlow reads (TFRecord files, the user's function) is checked once loaded
(`chain.prepared.with_loaded_data`).
"""

from __future__ import annotations

import logging
from dataclasses import replace
from typing import Callable, Sequence

from omegaconf import DictConfig

from chain import data
from chain.autoplan import settle
from chain.config import Settings
from chain.config.schema import Gpt
from chain.data import stream_shares, token_ids
from chain.planning import cluster, devices, fit, planner
from chain.planning.planner import Assignment
from chain.prepared import RunSpec, prepare, with_loaded_data
from chain.training import on_lost, ways
from chain.training.run import Run

log = logging.getLogger("chain")


def apply(spec: RunSpec) -> Assignment:
    """Apply the placement to TensorFlow (its logical devices, before the runtime starts) and check
    that every device the plan uses exists: the placement with the checked devices (and a note
    `devices.configure` had), a new record; when the runtime had started first, the stages on the
    devices that exist where the plan allows it (`devices.share_existing`, whose note is also logged
    as a warning); a multi-worker run checks its peers and makes its
    tf.distribute strategy instead (before anything starts the runtime)."""
    settings, assignment = spec.settings, spec.assignment
    if assignment.multi_worker:
        cluster.check_peers(assignment.multi_worker, assignment.task, settings.cluster.lost_after_s)
        cluster.multi_worker_tf_strategy()
        return assignment
    applied, note = devices.configure(assignment, settings.placement)
    late = None if applied else assignment.kind
    shared = None if applied else devices.share_existing(assignment, settings.placement)
    if (
        shared is not None
    ):  # the stages on the devices that exist: said where a notebook shows it, not only in run.notes
        log.warning("note: %s", shared.notes[-1])
        assignment = shared
    elif note is not None:
        assignment = assignment.noted(note)
    if assignment.topology == planner.MIRRORED:
        checked = devices.check_devices(assignment.mirrored_devices, given=False, role="replica", late=late)
        return replace(assignment, mirrored_devices=tuple(checked))
    if assignment.topology == planner.REPLICATED:  # every copy's devices; copy 0's are `devices`
        k = len(assignment.devices)
        flat = devices.check_devices(
            [d for row in assignment.copies for d in row], given=False, role="replica stage", late=late
        )
        copies = tuple(tuple(flat[r * k : (r + 1) * k]) for r in range(len(assignment.copies)))
        return replace(assignment, copies=copies, devices=copies[0])
    given = settings.placement.devices  # checked as the user wrote them, so errors quote them
    checked = devices.check_devices(given or assignment.devices, given=bool(given), late=late)
    return replace(assignment, devices=tuple(checked))


def setup(cfgs: Sequence[RunSpec | Settings | DictConfig | dict]) -> None:
    """Configure TensorFlow's logical devices now for every config this process will build (see
    `chain.setup`): the plan using the most devices is applied, and every plan is then checked
    against the devices that exist (the others reuse them, each stage still on its own device).
    A multi-worker run's devices are its hosts': nothing to set up here."""
    specs = [prepare(c) for c in cfgs]
    local = [s for s in specs if not s.assignment.multi_worker]
    for spec in sorted(local, key=lambda s: devices.count(s.assignment), reverse=True):
        apply(spec)


def build(
    cfg: RunSpec | Settings | DictConfig | dict,
    run_dir: str | None = None,
    *,
    stages: Sequence[Callable] | None = None,
    model=None,
) -> Run:
    """Prepare (unless given a prepared `RunSpec`), apply the placement and build a run (see `chain.build`)."""
    import keras

    from chain.training import compiled_clipping
    from chain.training.user_bodies import resolve

    spec = prepare(cfg)
    spec = replace(spec, assignment=apply(spec))  # a new record: a `RunSpec` given is never changed
    if settle.wanted(spec):  # placement.plan=auto: measured on the devices just applied, then the chosen plan's
        spec = settle.settle(spec, run_dir, model)
        spec = replace(spec, assignment=apply(spec))
    settings = spec.settings
    keras.utils.set_random_seed(settings.seed)  # the user's function may draw random numbers
    dataset = data.load(settings.data, settings.seed, spec.data_info, settings.ignored_label)
    spec = with_loaded_data(spec, dataset.info)
    settings, assignment = spec.settings, spec.assignment
    if isinstance(settings.stages[0].model, Gpt):  # the user's arrays of ids: each within the vocabulary
        dataset.shards = token_ids.check(
            settings.data,
            dataset.x,
            dataset.val_x,
            dataset.shards,
            settings.stages[0].model.vocab,
            dataset.target(settings.stages[-1].target).name,
            settings.ignored_label,
        )
    if dataset.shards is not None and assignment.topology == planner.MIRRORED:  # each replica streams its own files
        stream_shares.check_files(
            dataset.shards, len(assignment.mirrored_devices), getattr(settings.data, "path", None)
        )
    keras.utils.set_random_seed(settings.seed)  # weights start the same whatever reading the data drew
    bodies, labels, assignment = resolve(
        settings, assignment, dataset.info, spec.batch_cut, stages, model, spec.schedule
    )
    if bodies is not None and spec.inventory is not None:  # a cut model's stages are estimated once it is cut
        fit.check_stages_fit(assignment, assignment.footprints, spec.inventory)
    clipping_notes: list[str] = []
    settings = compiled_clipping.honour(settings, model, clipping_notes)  # a compiled model's clipping is kept
    assignment = assignment.noted(*clipping_notes)
    strategy = ways.create(
        settings, assignment, dataset.info, spec.batch_cut, spec.schedule, bodies=bodies, labels=labels
    )
    run = Run(settings, strategy, dataset, run_dir, spec.auto_plan)
    if assignment.cluster:  # the workers serve on after the run: watched as long as this process lives
        state = lambda: on_lost.noted(run_dir, run, run.intact())  # noqa: E731 (the step it reached)
        cluster.Watchdog(assignment.cluster, settings.cluster.lost_after_s, state).start()
    elif assignment.multi_worker:  # every host ends its own run: its peers are watched while it trains
        run.watchdog = cluster.Watchdog(
            assignment.multi_worker, settings.cluster.lost_after_s, run.intact, skip=assignment.task
        )
        run.watchdog.start()
    return run
