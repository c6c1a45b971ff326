"""The schedule a run's settings ask for, and the checks that need the schedules to answer.

`pipeline.schedule` names a built-in schedule (`chain.schedule.schedules`) or `file`, a CSV that
`chain.schedule.schedule_file` reads; with `interleaved`, `zbv` (or a file whose rows hold several
stages) the stages share devices, as the schedule's `placement` says. No TensorFlow: the preparation pass (`chain.prepared`) calls
`check_pipeline` once per run and keeps the schedule it returns on the `RunSpec`; the memory
estimate builds the schedules of the changes it offers with `pipeline_schedule`.
"""

from __future__ import annotations

import functools
import os

from chain.config.device_names import canonical
from chain.config.schema import Settings
from chain.data.paths import existing
from chain.errors import ConfigError
from chain.schedule import schedule_file, schedules


def pipeline_schedule(s: Settings) -> schedules.Schedule:
    """mode=e2e's schedule: the built-in `pipeline.schedule`, or the one `pipeline.schedule_file` holds
    (read and checked here: a ConfigError naming the key for a file that cannot run)."""
    p, n_stages = s.pipeline, len(s.stages)
    if p.schedule != schedules.FILE:
        return schedules.build(p.schedule, n_stages, p.microbatches, pipeline_devices(s))
    if p.schedule_file is None:
        raise ConfigError(
            "pipeline.schedule=file reads the schedule from pipeline.schedule_file, which is not set; "
            "give a CSV (one row per device, cells like F3, B3, W3), or a built-in schedule: "
            f"{', '.join(schedules.NAMES)}"
        )
    path = existing(p.schedule_file, "pipeline.schedule_file")
    return _read(path, os.stat(path).st_mtime_ns, n_stages, p.microbatches)


@functools.lru_cache(maxsize=8)
def _read(path: str, version: int, n_stages: int, microbatches: int) -> schedules.Schedule:
    """A schedule file read and checked once per version of the file (`version`: its mtime): the
    preparation pass, the planning and the strategy all ask for it."""
    try:
        return schedule_file.read(path, n_stages, microbatches)
    except schedule_file.ScheduleFileError as e:
        raise ConfigError(f"pipeline.schedule_file={path!r} {e}") from None


def pipeline_devices(s: Settings) -> int | None:
    """How many devices interleaved stages share (stages / pipeline.virtual_stages), else None: the
    other built-in schedules place their stages themselves (zbv two a device, the rest one)."""
    p = s.pipeline
    if p.schedule != "interleaved" or p.virtual_stages == 1:
        return None
    return len(s.stages) // p.virtual_stages


def check_interleaved(s: Settings) -> None:
    """schedule=interleaved: V stages per device divide the stages, M is a multiple of the devices
    (the anchors' requirement), and one memory limit for the stages a device shares. (Stages named on
    devices: `check_given_devices`.)"""
    p, n_stages = s.pipeline, len(s.stages)
    if p.schedule != "interleaved":
        if p.virtual_stages != 1 and p.schedule == "zbv":
            raise ConfigError(
                f"pipeline.virtual_stages={p.virtual_stages} is interleaved's setting; pipeline.schedule=zbv "
                "always runs two stages on each device: set pipeline.virtual_stages=1"
            )
        if p.virtual_stages != 1:
            raise ConfigError(
                f"pipeline.virtual_stages={p.virtual_stages} puts several stages on each device, which "
                f"only pipeline.schedule=interleaved runs (is {p.schedule}); set pipeline.virtual_stages=1 "
                "or pipeline.schedule=interleaved"
            )
        return
    v = p.virtual_stages
    if n_stages % v:
        raise ConfigError(
            f"pipeline.virtual_stages={v} does not divide the {n_stages} stages: each device holds "
            f"pipeline.virtual_stages of them (e.g. {max(d for d in range(1, n_stages + 1) if n_stages % d == 0 and d <= v)})"
        )
    d = n_stages // v
    if p.microbatches % d:
        raise ConfigError(
            f"pipeline.microbatches={p.microbatches} is not a multiple of the {d} devices of "
            f"pipeline.schedule=interleaved ({n_stages} stages / pipeline.virtual_stages={v}); use "
            + (
                f"pipeline.microbatches={d * (p.microbatches // d)} or {d * (p.microbatches // d + 1)}"
                if p.microbatches > d
                else f"pipeline.microbatches={d} (or a multiple)"
            )
        )
    if v > 1 and isinstance(s.placement.memory_limit_mb, (list, tuple)):
        raise ConfigError(
            f"placement.memory_limit_mb: with pipeline.schedule=interleaved each device holds "
            f"{v} stages (pipeline.virtual_stages); give one number (MB per logical GPU)"
        )


def check_pipeline(s: Settings) -> schedules.Schedule:
    """mode=e2e: the schedule can run (`pipeline_schedule`), its file is given only for schedule=file,
    and pipeline.schedule_out is written by plan_only=true into a folder that exists. Returns the
    schedule, built here once per run (the preparation pass keeps it on the `RunSpec`)."""
    p = s.pipeline
    check_interleaved(s)
    if p.schedule_file is not None and p.schedule != schedules.FILE:
        raise ConfigError(
            f"pipeline.schedule_file is read only with pipeline.schedule=file (is {p.schedule}); "
            "set pipeline.schedule=file or remove pipeline.schedule_file"
        )
    if p.schedule_out is not None:
        if not s.plan_only:
            raise ConfigError(
                "pipeline.schedule_out is written by plan_only=true (which trains nothing); "
                "add plan_only=true or remove pipeline.schedule_out"
            )
        folder = os.path.dirname(os.path.abspath(p.schedule_out))
        if not os.path.isdir(folder) or os.path.isdir(p.schedule_out):
            raise ConfigError(
                f"pipeline.schedule_out={p.schedule_out!r}: "
                + (
                    "is a directory; name a file"
                    if os.path.isdir(p.schedule_out)
                    else f"the folder {folder} does not exist"
                )
            )
    check_zbv(s)
    schedule = pipeline_schedule(s)
    check_given_devices(s, schedule)
    if p.recompute != "never" and schedules.is_split(schedule):
        raise ConfigError(
            f"pipeline.recompute={p.recompute} is not available with a split backward (pipeline.schedule="
            f"{p.schedule} runs B and W apart, and W needs what the forward kept): use "
            "pipeline.recompute=never, or pipeline.schedule=1f1b or gpipe"
        )
    return schedule


def check_zbv(s: Settings) -> None:
    """schedule=zbv: an even number of stages (two on each device), and no pipeline.virtual_stages
    (the V's two stages a device are not a setting)."""
    if s.pipeline.schedule != "zbv":
        return
    n_stages = len(s.stages)
    if n_stages % 2:
        raise ConfigError(
            f"pipeline.schedule=zbv runs two stages on each device (stage k and stage 2D-1-k on device k), "
            f"so the chain needs an even number of stages, not {n_stages}; use "
            + (f"{n_stages - 1} or {n_stages + 1}" if n_stages > 1 else "2")
            + " stages, or another schedule"
        )
    if isinstance(s.placement.memory_limit_mb, (list, tuple)):
        raise ConfigError(
            "placement.memory_limit_mb: with pipeline.schedule=zbv each device holds 2 stages; give one "
            "number (MB per logical GPU)"
        )


def check_given_devices(s: Settings, schedule: schedules.Schedule) -> None:
    """Stages named on devices (`placement.devices`) follow a shared schedule's placement: the stages of
    one row of the schedule on one device (`schedules.placement_rule`), different rows on different ones."""
    given = s.placement.devices
    if not given or not schedule.placement:
        return
    p, n_stages, d = s.pipeline, len(s.stages), schedule.devices
    why = f" ({n_stages} stages / pipeline.virtual_stages={p.virtual_stages})" if p.schedule == "interleaved" else ""
    head = [schedule.row_stages(r)[0] for r in range(d)]  # each row's first stage names its device
    for k in range(n_stages):
        j = head[schedule.row(k)]
        if canonical(given[k]) != canonical(given[j]):
            raise ConfigError(
                f"placement.devices[{k}]={given[k]}: pipeline.schedule={p.schedule} runs "
                f"{schedules.placement_rule(schedule)}{why}, so stage {k} belongs on "
                f"placement.devices[{j}]={given[j]}"
            )
    if len({canonical(given[j]) for j in head}) < d:
        raise ConfigError(
            f"placement.devices: pipeline.schedule={p.schedule} needs {d} different devices for "
            f"stages {', '.join(map(str, head))}{why}"
        )


def shared_devices(schedule: schedules.Schedule) -> int | None:
    """How many devices `schedule`'s stages share (interleaved stages, zbv's V, a file whose rows hold
    several stages: `Schedule.placement` says which stage runs on which), or None (a device per stage)."""
    return schedule.devices if schedule.placement else None
