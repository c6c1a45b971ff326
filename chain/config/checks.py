"""Checks across settings: what must hold between keys, known without TensorFlow.

`check(settings, info)` raises one `ConfigError` line for the first problem and returns the
`note:` lines for settings the run will ignore; `settle` adds those notes and the number of
steps (`trainer.steps`, or what `trainer.epochs` makes of the training examples). What depends
on the data (`check_data`) is checked here when the data is known without TensorFlow, and by
`chain.training.build` once it is loaded otherwise (TFRecord files, the user's function).
Everything here is O(1) in configured numbers (a batch size of 10^12 costs nothing to
refuse). What needs the runtime (devices that exist, their memory, the replicas a mirrored
run finds) is checked in `chain.training.build`, in one place, before anything is printed or
written.
"""

from __future__ import annotations

import math
import os
from dataclasses import replace

from chain.config.schema import MAX_BATCH, KerasModel, PlacementSettings, Settings
from chain.config.shapes import stage_shapes
from chain.data import files
from chain.data.catalog import DataInfo, describe
from chain.errors import ConfigError, DeviceError
from chain.pipeline import schedule_file, schedules
from chain.planning.devices import canonical

DEFAULT_STEPS = 400  # trainer.steps when neither it nor trainer.epochs is set (digits: ~16 epochs)


def microbatches_divide(microbatches: int, batch_size: int) -> None:
    """mode=e2e cuts every batch into equal microbatches: M must divide the batch size."""
    if batch_size % microbatches:
        fits = math.gcd(microbatches, batch_size)
        bigger = batch_size + microbatches - batch_size % microbatches
        raise ConfigError(
            f"pipeline.microbatches={microbatches} does not divide data.batch_size={batch_size}; microbatches must "
            f"be equal: use pipeline.microbatches={fits} or data.batch_size={bigger} (a multiple of {microbatches})")


def pipeline_schedule(s: Settings) -> schedules.Schedule:
    """mode=e2e's schedule: the built-in `pipeline.schedule`, or the one `pipeline.schedule_file` holds
    (read and checked here: a ConfigError naming the key for a file that cannot run)."""
    p, n_stages = s.pipeline, len(s.stages)
    if p.schedule != schedules.FILE:
        return schedules.build(p.schedule, n_stages, p.microbatches, pipeline_devices(s))
    if p.schedule_file is None:
        raise ConfigError("pipeline.schedule=file reads the schedule from pipeline.schedule_file, which is not set; "
                          "give a CSV (one row per device, cells like F3, B3, W3), or a built-in schedule: "
                          f"{', '.join(schedules.NAMES)}")
    path = files.existing(p.schedule_file, "pipeline.schedule_file")
    try:
        schedule = schedule_file.read(path, n_stages, p.microbatches)
    except schedule_file.ScheduleFileError as e:
        raise ConfigError(f"pipeline.schedule_file={path!r} {e}") from None
    d = schedule.devices
    if schedule.placement and any(schedule.row(k) != k % d for k in range(n_stages)):
        k = next(k for k in range(n_stages) if schedule.row(k) != k % d)
        raise ConfigError(f"pipeline.schedule_file={path!r} runs stage {k} on row {schedule.row(k) + 1}: stages share "
                          f"devices only as interleaved stages do, stage k on row (k mod {d}) + 1")
    return schedule


def pipeline_devices(s: Settings) -> int | None:
    """How many devices the stages share: stages / pipeline.virtual_stages with schedule=interleaved,
    or a schedule file's rows when they hold several stages (stage k on device k mod that), else
    None (a device per stage)."""
    p = s.pipeline
    if p.schedule == schedules.FILE and p.schedule_file is not None:
        schedule = pipeline_schedule(s)  # a file whose rows hold several stages each
        return schedule.devices if schedule.placement else None
    if p.schedule != "interleaved" or p.virtual_stages == 1:
        return None
    return len(s.stages) // p.virtual_stages


def check_interleaved(s: Settings) -> None:
    """schedule=interleaved: V stages per device divide the stages, M is a multiple of the devices
    (the anchors' requirement), and stages named on devices follow the loop placement."""
    p, n_stages = s.pipeline, len(s.stages)
    if p.schedule != "interleaved":
        if p.virtual_stages != 1:
            raise ConfigError(f"pipeline.virtual_stages={p.virtual_stages} puts several stages on each device, which "
                              f"only pipeline.schedule=interleaved runs (is {p.schedule}); set pipeline.virtual_stages=1 "
                              "or pipeline.schedule=interleaved")
        return
    v = p.virtual_stages
    if n_stages % v:
        raise ConfigError(f"pipeline.virtual_stages={v} does not divide the {n_stages} stages: each device holds "
                          f"pipeline.virtual_stages of them (e.g. {max(d for d in range(1, n_stages + 1) if n_stages % d == 0 and d <= v)})")
    d = n_stages // v
    if p.microbatches % d:
        raise ConfigError(f"pipeline.microbatches={p.microbatches} is not a multiple of the {d} devices of "
                          f"pipeline.schedule=interleaved ({n_stages} stages / pipeline.virtual_stages={v}); use "
                          + (f"pipeline.microbatches={d * (p.microbatches // d)} or {d * (p.microbatches // d + 1)}"
                             if p.microbatches > d else f"pipeline.microbatches={d} (or a multiple)"))
    if v > 1 and isinstance(s.placement.memory_limit_mb, (list, tuple)):
        raise ConfigError(f"placement.memory_limit_mb: with pipeline.schedule=interleaved each device holds "
                          f"{v} stages (pipeline.virtual_stages); give one number (MB per logical GPU)")
    given = s.placement.devices
    if given and v > 1:
        for k in range(d, n_stages):
            if canonical(given[k]) != canonical(given[k % d]):
                raise ConfigError(f"placement.devices[{k}]={given[k]}: pipeline.schedule=interleaved runs stage k on "
                                  f"device k mod {d} ({n_stages} stages / pipeline.virtual_stages={v}), so stage {k} "
                                  f"belongs on placement.devices[{k % d}]={given[k % d]}")
        if len({canonical(x) for x in given[:d]}) < d:
            raise ConfigError(f"placement.devices: pipeline.schedule=interleaved needs {d} different devices for "
                              f"stages 0-{d - 1} ({n_stages} stages / pipeline.virtual_stages={v})")


def check_pipeline(s: Settings) -> None:
    """mode=e2e: the schedule can run (`pipeline_schedule`), its file is given only for schedule=file,
    and pipeline.schedule_out is written by plan_only=true into a folder that exists."""
    p = s.pipeline
    check_interleaved(s)
    if p.schedule_file is not None and p.schedule != schedules.FILE:
        raise ConfigError(f"pipeline.schedule_file is read only with pipeline.schedule=file (is {p.schedule}); "
                          "set pipeline.schedule=file or remove pipeline.schedule_file")
    if p.schedule_out is not None:
        if not s.plan_only:
            raise ConfigError("pipeline.schedule_out is written by plan_only=true (which trains nothing); "
                              "add plan_only=true or remove pipeline.schedule_out")
        folder = os.path.dirname(os.path.abspath(p.schedule_out))
        if not os.path.isdir(folder) or os.path.isdir(p.schedule_out):
            raise ConfigError(f"pipeline.schedule_out={p.schedule_out!r}: "
                              + ("is a directory; name a file" if os.path.isdir(p.schedule_out)
                                 else f"the folder {folder} does not exist"))
    pipeline_schedule(s)


def batch_over_replicas(batch_size: int, replicas: int) -> int:
    """The per-replica batch of a mirrored run, or a ConfigError if `replicas` do not divide `batch_size`."""
    if batch_size % replicas:
        raise ConfigError(
            f"data.batch_size={batch_size} does not divide over {replicas} replicas (placement.replicas); with "
            f"placement.fallback=mirrored data.batch_size is the global batch: use a multiple of {replicas}, "
            f"e.g. {max(replicas, batch_size // replicas * replicas)}")
    return batch_size // replicas


def placement_fits(p: PlacementSettings, n_stages: int) -> None:
    """What `placement` must say whatever the machine: one memory limit, or one per stage; stages
    on named devices, or every stage on every replica (placement.fallback=mirrored), not both."""
    given = p.memory_limit_mb
    if isinstance(given, (list, tuple)) and len(given) != n_stages:
        raise ConfigError(f"placement.memory_limit_mb has {len(given)} entries, but there are {n_stages} stages; "
                          "give one number (MB per logical GPU) or one per stage")
    if p.devices and p.fallback == "mirrored":
        raise ConfigError("placement.devices puts each stage on a device, placement.fallback=mirrored puts "
                          "every stage on every replica: set only one of them")


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
        files.keras_model_file(model.path, "model.path")
    p = s.placement
    if p.split is not None and p.balance != "even":
        raise ConfigError(f"placement.split and placement.balance={p.balance} both say where to cut: set one of them")
    if p.split is not None and len(p.split) != len(s.stages):
        raise ConfigError(f"placement.split has {len(p.split)} entries, but there are {len(s.stages)} stages; "
                          "give the layers of each stage")


def check_side_by_side(s: Settings) -> None:
    """Independent models share the data stream, not a pipeline: no accumulation, no replicas, no cut."""
    if s.trainer.grad_accum != 1:
        raise ConfigError("trainer.grad_accum applies to a chain; mode=side_by_side gives each model its own "
                          "batch size instead (variants[i].data.batch_size)")
    if s.placement.fallback == "mirrored":
        raise ConfigError("placement.fallback=mirrored applies to a chain; side by side, models share devices "
                          "(placement.devices) or each has its own")
    if any(isinstance(spec.model, KerasModel) for spec in s.stages):
        raise ConfigError("model=keras cuts one model into a chain; side by side, each variant is a whole model "
                          "(mlp, conv, or a builder with _target_)")
    for v in s.variants:  # a slice of the shared batch, so it is the same whatever the neighbours
        if v.batch_size > s.data.batch_size:
            raise ConfigError(f"variant {v.name!r}: data.batch_size={v.batch_size} is larger than data.batch_size="
                              f"{s.data.batch_size}, the shared batch every variant takes its first examples from; "
                              f"set data.batch_size={v.batch_size} (and the others' own data.batch_size)")


def check_data(s: Settings, info: DataInfo) -> None:
    """What must hold between the settings and the data: batch vs data size, targets, stage
    shapes, loss vs target, validation for best checkpoints and early stopping. Run by the
    config checks when the data is known without TensorFlow, else by `chain.training.build`
    once the data is loaded (before anything is printed or written)."""
    per_step = s.examples_per_step
    if per_step > info.examples:
        have = f"{info.examples} training examples" if info.val_examples else f"{info.examples} examples"
        if s.trainer.grad_accum == 1:
            raise ConfigError(f"data.batch_size={per_step} is larger than data={info.name} ({have})")
        raise ConfigError(f"trainer.grad_accum={s.trainer.grad_accum} x data.batch_size={s.data.batch_size} = "
                          f"{per_step} examples per step is more than data={info.name} has ({have})")
    for spec in s.stages:
        info.target(spec.target)
    stage_shapes(s.stages, info, s.mode)  # a stage that cannot take its input
    if s.mode == "e2e":
        loss_fits_target(s.loss, info.target(s.stages[-1].target), info.name)
    if not info.val_examples:
        wants = [k for k, on in (("checkpoint.best=true", s.checkpoint.best),
                                 (f"trainer.early_stop_patience={s.trainer.early_stop_patience}",
                                  s.trainer.early_stop_patience is not None)) if on]
        if wants:
            raise ConfigError(f"{wants[0]} needs validation examples, but data={info.name} has none "
                              f"(data.val_fraction={s.data.val_fraction}); set data.val_fraction > 0")


def steps(s: Settings, info: DataInfo | None) -> int | None:
    """The run's optimizer steps: `trainer.steps`, or `trainer.epochs` passes over the training
    examples (rounded up to whole steps; None while the data is unknown), or DEFAULT_STEPS."""
    t = s.trainer
    if t.steps is not None:
        return t.steps
    if t.epochs is None:
        return DEFAULT_STEPS
    return None if info is None else math.ceil(t.epochs * info.examples / s.examples_per_step)


def check_profile(s: Settings, n_steps: int | None) -> None:
    """`trainer.profile` traces steps of a pipeline schedule that the run takes (`n_steps`: the run's
    steps, None while the data that `trainer.epochs` counts in is unknown)."""
    if s.trainer.profile is None:
        return
    start, stop = s.trainer.profile
    if n_steps is not None and stop > n_steps:
        given = "trainer.steps" if s.trainer.steps is not None else "the run's steps"
        raise ConfigError(f"trainer.profile=[{start},{stop}] goes past {given}={n_steps}")
    if s.mode != "e2e":
        raise ConfigError("trainer.profile measures a pipeline schedule's actions: it needs mode=e2e")
    profile_ports(s.cluster.workers, s.cluster.profile_ports)


def profile_ports(workers, ports) -> None:
    """`trainer.profile` on cluster workers traces each worker's profiler server: one port per worker."""
    if workers and (ports is None or len(ports) != len(workers)):
        raise ConfigError(f"trainer.profile on {len(workers)} cluster workers needs cluster.profile_ports with one "
                          "port per worker (each started with python -m chain.worker --profile-port PORT)")


def check(s: Settings, info: DataInfo | None) -> tuple[str, ...]:
    """Raise a ConfigError for the first inconsistency of `s` (with the data `info` describes,
    when known); return notes on ignored settings."""
    devices = s.placement.devices
    if devices is not None and len(devices) != len(s.stages):
        raise ConfigError(f"placement.devices has {len(devices)} entries, but there are {len(s.stages)} stages; "
                          "give one device per stage")
    for k, d in enumerate(devices or ()):
        try:
            canonical(d)
        except DeviceError as e:
            raise ConfigError(f"placement.devices[{k}]: {e}") from None
    placement_fits(s.placement, len(s.stages))
    if s.examples_per_step > MAX_BATCH:
        raise ConfigError(f"trainer.grad_accum x data.batch_size = {s.examples_per_step} examples per step; "
                          f"at most {MAX_BATCH}")
    t = s.trainer
    if t.steps is not None and t.epochs is not None:
        raise ConfigError(f"trainer.steps={t.steps} and trainer.epochs={t.epochs} are both set; give one")
    if t.early_stop_patience is not None and not t.eval_every:
        raise ConfigError(f"trainer.early_stop_patience={t.early_stop_patience} counts evaluations, but "
                          "trainer.eval_every=0 evaluates only at the end; set trainer.eval_every=N (steps)")
    if s.mode == "side_by_side":
        check_side_by_side(s)
    if info is not None:
        check_data(s, info)
    check_cut(s)
    if s.placement.fallback == "mirrored" and s.placement.replicas is not None:
        batch_over_replicas(s.data.batch_size, s.placement.replicas)
    notes = []
    if s.mode == "e2e":
        microbatches_divide(s.pipeline.microbatches, s.data.batch_size)
        check_pipeline(s)
    else:
        defaults = {"schedule": "gpipe", "microbatches": 1, "virtual_stages": 1, "schedule_file": None,
                    "schedule_out": None}
        ignored = [f"pipeline.{k}={v}" for k, v in ((k, getattr(s.pipeline, k)) for k in defaults) if v != defaults[k]]
        if s.loss != "sparse_categorical_crossentropy":
            ignored.append(f"loss={s.loss}")
        if ignored:
            notes.append(f"{', '.join(ignored)} ignored: mode={s.mode} trains each "
                         f"{'stage' if s.mode == 'local' else 'model'}'s head with its own loss "
                         "(cross-entropy on classes, squared error on values), without a pipeline")
    return tuple(notes)


def settle(s: Settings) -> Settings:
    """`s` checked (`check`), with its notes and, where the data is known, its steps."""
    info = describe(s.data)
    notes = check(s, info)
    n_steps = steps(s, info)
    check_profile(s, n_steps)
    return replace(s, notes=notes, trainer=replace(s.trainer, steps=n_steps))


def with_data(s: Settings, info: DataInfo) -> Settings:
    """`s` checked against the loaded data (`check_data`), with its steps known."""
    check_data(s, info)
    n_steps = steps(s, info)
    check_profile(s, n_steps)
    return replace(s, trainer=replace(s.trainer, steps=n_steps))
