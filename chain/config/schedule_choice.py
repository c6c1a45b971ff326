"""The schedule a run's settings ask for, and the checks that need the schedules to answer.

`pipeline.schedule` names a built-in schedule (`chain.schedule.schedules`) or `file`, a CSV that
`chain.schedule.schedule_file` reads; with `interleaved`, `zbv` (or a file whose rows hold several
stages) the stages share devices, as the schedule's `stage_rows` say. No TensorFlow: the preparation pass (`chain.prepared`) calls
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
            f"{', '.join(schedules.BUILDERS)}"
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


def _row(s: Settings) -> schedules.Builder | None:
    """`pipeline.schedule`'s row of `schedules.BUILDERS` (None: a schedule file)."""
    return schedules.BUILDERS.get(s.pipeline.schedule)


def _rows(s: Settings) -> schedules.Rows | None:
    """How `pipeline.schedule` places its stages (None: a schedule file's rows say)."""
    row = _row(s)
    return row.rows if row is not None else None


def _looped(prefix: str = "") -> str:
    """The looped schedules (`pipeline.virtual_stages` is theirs), for messages: `interleaved`, or
    `pipeline.schedule=interleaved` with that `prefix`."""
    return " or ".join(prefix + name for name in schedules.where(schedules.Rows.LOOP))


def pipeline_devices(s: Settings) -> int | None:
    """How many devices a looped schedule's stages share (stages / pipeline.virtual_stages), else None:
    the other built-in schedules place their stages themselves (zbv two a device, the rest one)."""
    p = s.pipeline
    if _rows(s) is not schedules.Rows.LOOP or p.virtual_stages == 1:
        return None
    return len(s.stages) // p.virtual_stages


def check_virtual_stages(s: Settings) -> None:
    """pipeline.virtual_stages is a looped schedule's (interleaved's): V stages per device divide the
    stages, one memory limit for the stages a device shares; and M is a multiple of the devices where
    the schedule's row asks it (interleaved's anchors). (Stages named on devices: `check_given_devices`.)"""
    p, n_stages = s.pipeline, len(s.stages)
    if _rows(s) is not schedules.Rows.LOOP:
        if p.virtual_stages != 1 and _rows(s) is schedules.Rows.V:
            raise ConfigError(
                f"pipeline.virtual_stages={p.virtual_stages} is {_looped()}'s setting; pipeline.schedule={p.schedule} "
                "always runs two stages on each device: set pipeline.virtual_stages=1"
            )
        if p.virtual_stages != 1:
            either = _looped("pipeline.schedule=")
            raise ConfigError(
                f"pipeline.virtual_stages={p.virtual_stages} puts several stages on each device, which "
                f"only {either} runs (is {p.schedule}); set pipeline.virtual_stages=1 or {either}"
            )
        row = _row(s)
        if row is not None:  # a schedule file's rows are checked when it is read
            check_microbatches(s, max(1, n_stages // (row.per_device or 1)))
        return
    v = p.virtual_stages
    if n_stages % v:
        raise ConfigError(
            f"pipeline.virtual_stages={v} does not divide the {n_stages} stages: each device holds "
            f"pipeline.virtual_stages of them (e.g. {max(d for d in range(1, n_stages + 1) if n_stages % d == 0 and d <= v)})"
        )
    check_microbatches(s, n_stages // v, f" ({n_stages} stages / pipeline.virtual_stages={v})")
    if v > 1 and isinstance(s.placement.memory_limit_mb, (list, tuple)):
        raise ConfigError(
            f"placement.memory_limit_mb: with pipeline.schedule={p.schedule} each device holds "
            f"{v} stages (pipeline.virtual_stages); give one number (MB per logical GPU)"
        )


def check_microbatches(s: Settings, d: int, why: str = "") -> None:
    """pipeline.microbatches a multiple of the schedule's `d` devices, where its row asks it."""
    p = s.pipeline
    row = _row(s)
    if row is None or not row.microbatches_of_devices or not p.microbatches % d:
        return
    raise ConfigError(
        f"pipeline.microbatches={p.microbatches} is not a multiple of the {d} devices of "
        f"pipeline.schedule={p.schedule}{why}; use "
        + (
            f"pipeline.microbatches={d * (p.microbatches // d)} or {d * (p.microbatches // d + 1)}"
            if p.microbatches > d
            else f"pipeline.microbatches={d} (or a multiple)"
        )
    )


def check_pipeline(s: Settings) -> schedules.Schedule:
    """mode=e2e: the schedule can run (`pipeline_schedule`), its file is given only for schedule=file,
    and pipeline.schedule_out is written by plan_only=true into a folder that exists. Returns the
    schedule, built here once per run (the preparation pass keeps it on the `RunSpec`)."""
    p = s.pipeline
    check_virtual_stages(s)
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
    check_two_per_device(s)
    schedule = pipeline_schedule(s)
    check_given_devices(s, schedule)
    if p.recompute != "never" and schedules.is_split(schedule):
        raise ConfigError(
            f"pipeline.recompute={p.recompute} is not available with a split backward (pipeline.schedule="
            f"{p.schedule} runs B and W apart, and W needs what the forward kept): use "
            "pipeline.recompute=never, or pipeline.schedule=1f1b or gpipe"
        )
    return schedule


def check_two_per_device(s: Settings) -> None:
    """A schedule of two stages a device (zbv's V): an even number of stages, and one memory limit for
    the two stages a device holds (pipeline.virtual_stages: `check_virtual_stages`)."""
    if _rows(s) is not schedules.Rows.V:
        return
    n_stages, name = len(s.stages), s.pipeline.schedule
    if n_stages % 2:
        raise ConfigError(
            f"pipeline.schedule={name} runs two stages on each device (stage k and stage 2D-1-k on device k), "
            f"so the chain needs an even number of stages, not {n_stages}; use "
            + (f"{n_stages - 1} or {n_stages + 1}" if n_stages > 1 else "2")
            + " stages, or another schedule"
        )
    if isinstance(s.placement.memory_limit_mb, (list, tuple)):
        raise ConfigError(
            f"placement.memory_limit_mb: with pipeline.schedule={name} each device holds 2 stages; give one "
            "number (MB per logical GPU)"
        )


def check_given_devices(s: Settings, schedule: schedules.Schedule) -> None:
    """Stages named on devices (`placement.devices`) follow a shared schedule's placement: the stages of
    one row of the schedule on one device (`schedules.rows_rule`), different rows on different ones."""
    given = s.placement.devices
    if not given or not schedule.stage_rows:
        return
    p, n_stages, d = s.pipeline, len(s.stages), schedule.devices
    looped = _rows(s) is schedules.Rows.LOOP
    why = f" ({n_stages} stages / pipeline.virtual_stages={p.virtual_stages})" if looped else ""
    head = [schedule.row_stages(r)[0] for r in range(d)]  # each row's first stage names its device
    for k in range(n_stages):
        j = head[schedule.row(k)]
        if canonical(given[k]) != canonical(given[j]):
            raise ConfigError(
                f"placement.devices[{k}]={given[k]}: pipeline.schedule={p.schedule} runs "
                f"{schedules.rows_rule(schedule)}{why}, so stage {k} belongs on "
                f"placement.devices[{j}]={given[j]}"
            )
    if len({canonical(given[j]) for j in head}) < d:
        raise ConfigError(
            f"placement.devices: pipeline.schedule={p.schedule} needs {d} different devices for "
            f"stages {', '.join(map(str, head))}{why}"
        )


def shared_devices(schedule: schedules.Schedule) -> int | None:
    """How many devices `schedule`'s stages share (interleaved stages, zbv's V, a file whose rows hold
    several stages: `Schedule.stage_rows` says which stage runs on which), or None (a device per stage)."""
    return schedule.devices if schedule.stage_rows else None
