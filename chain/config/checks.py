"""Checks across settings: what must hold between keys, known without TensorFlow.

`check(settings)` raises one `ConfigError` line for the first problem and returns the
`note:` lines for settings the run will ignore. Everything here is O(1) in configured
numbers (a batch size of 10^12 costs nothing to refuse). What needs the runtime (devices
that exist, their memory, the replicas a mirrored run finds) is checked in
`chain.training.build`, in one place, before anything is printed or written.
"""

from __future__ import annotations

import math
import os

from chain.config.schema import MAX_BATCH, KerasModel, Settings
from chain.config.shapes import stage_shapes
from chain.data.catalog import describe
from chain.errors import ConfigError, DeviceError
from chain.planning.devices import canonical


def microbatches_divide(microbatches: int, batch_size: int) -> None:
    """mode=e2e cuts every batch into equal microbatches: M must divide the batch size."""
    if batch_size % microbatches:
        fits = math.gcd(microbatches, batch_size)
        bigger = batch_size + microbatches - batch_size % microbatches
        raise ConfigError(
            f"pipeline.microbatches={microbatches} does not divide data.batch_size={batch_size}; microbatches must "
            f"be equal: use pipeline.microbatches={fits} or data.batch_size={bigger} (a multiple of {microbatches})")


def batch_over_replicas(batch_size: int, replicas: int) -> int:
    """The per-replica batch of a mirrored run, or a ConfigError if `replicas` do not divide `batch_size`."""
    if batch_size % replicas:
        raise ConfigError(
            f"data.batch_size={batch_size} does not divide over {replicas} replicas (placement.replicas); with "
            f"placement.fallback=mirrored data.batch_size is the global batch: use a multiple of {replicas}, "
            f"e.g. {max(replicas, batch_size // replicas * replicas)}")
    return batch_size // replicas


def loss_fits_target(loss: str, target, data: str) -> None:
    """Cross-entropy needs class labels; a real-valued target needs `mse`."""
    if loss == "sparse_categorical_crossentropy" and target.is_regression:
        raise ConfigError(
            f"loss={loss} needs class labels, but target {target.name!r} of data={data} is a real value; "
            "use loss=mse (or a class target: stage.target=label)")


def check_cut(s: Settings) -> None:
    """`model=keras` cuts one model into all the stages; `placement.split`/`balance` say where."""
    keras_models = {spec.model for spec in s.stages if isinstance(spec.model, KerasModel)}
    if keras_models:
        (model, *others) = keras_models
        if others or any(not isinstance(spec.model, KerasModel) for spec in s.stages):
            raise ConfigError("model=keras cuts one model into every stage; per-stage models do not go with it "
                              "(drop them from +stages=[...], or use builders: model._target_=...)")
        if not model.path.endswith(".keras"):
            raise ConfigError(f"model.path={model.path!r} must be a Keras model file (.keras)")
        if not os.path.isfile(model.path):
            raise ConfigError(f"model.path={model.path!r}: no such file")
    p = s.placement
    if p.split is not None and p.balance != "even":
        raise ConfigError(f"placement.split and placement.balance={p.balance} both say where to cut: set one of them")
    if p.split is not None and len(p.split) != len(s.stages):
        raise ConfigError(f"placement.split has {len(p.split)} entries, but there are {len(s.stages)} stages; "
                          "give the layers of each stage")


def check_profile(s: Settings) -> None:
    """`trainer.profile` traces steps of a pipeline schedule that the run takes."""
    if s.trainer.profile is None:
        return
    start, stop = s.trainer.profile
    if stop > s.trainer.steps:
        raise ConfigError(f"trainer.profile=[{start},{stop}] goes past trainer.steps={s.trainer.steps}")
    if s.mode != "e2e":
        raise ConfigError("trainer.profile measures a pipeline schedule's actions: it needs mode=e2e")
    profile_ports(s.cluster.workers, s.cluster.profile_ports)


def profile_ports(workers, ports) -> None:
    """`trainer.profile` on cluster workers traces each worker's profiler server: one port per worker."""
    if workers and (ports is None or len(ports) != len(workers)):
        raise ConfigError(f"trainer.profile on {len(workers)} cluster workers needs cluster.profile_ports with one "
                          "port per worker (each started with python -m chain.worker --profile-port PORT)")


def check(s: Settings) -> tuple[str, ...]:
    """Raise a ConfigError for the first inconsistency of `s`; return notes on ignored settings."""
    info = describe(s.data)
    devices = s.placement.devices
    if devices is not None and len(devices) != len(s.stages):
        raise ConfigError(f"placement.devices has {len(devices)} entries, but there are {len(s.stages)} stages; "
                          "give one device per stage")
    for k, d in enumerate(devices or ()):
        try:
            canonical(d)
        except DeviceError as e:
            raise ConfigError(f"placement.devices[{k}]: {e}") from None
    per_step = s.examples_per_step
    if per_step > info.examples:
        if s.trainer.grad_accum == 1:
            raise ConfigError(f"data.batch_size={per_step} is larger than data={info.name} ({info.examples} examples)")
        raise ConfigError(f"trainer.grad_accum={s.trainer.grad_accum} x data.batch_size={s.data.batch_size} = "
                          f"{per_step} examples per step is more than data={info.name} has ({info.examples})")
    if per_step > MAX_BATCH:
        raise ConfigError(f"trainer.grad_accum x data.batch_size = {per_step} examples per step; at most {MAX_BATCH}")
    for k, spec in enumerate(s.stages):
        info.target(spec.target)
    stage_shapes(s.stages, info, s.mode)  # a stage that cannot take its input
    check_cut(s)
    check_profile(s)
    if s.placement.fallback == "mirrored" and s.placement.replicas is not None:
        batch_over_replicas(s.data.batch_size, s.placement.replicas)
    notes = []
    if s.mode == "e2e":
        microbatches_divide(s.pipeline.microbatches, s.data.batch_size)
        loss_fits_target(s.loss, info.target(s.stages[-1].target), info.name)
    else:
        ignored = [f"pipeline.{k}={v}" for k, v in (("schedule", s.pipeline.schedule),
                                                   ("microbatches", s.pipeline.microbatches))
                   if v != {"schedule": "gpipe", "microbatches": 1}[k]]
        if s.loss != "sparse_categorical_crossentropy":
            ignored.append(f"loss={s.loss}")
        if ignored:
            notes.append(f"{', '.join(ignored)} ignored: mode=local trains each stage's head with its own loss "
                         "(cross-entropy on classes, squared error on values), without a pipeline")
    return tuple(notes)
