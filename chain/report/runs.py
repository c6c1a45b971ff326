"""What a report shows of one run, read from its directory: summary.json, the config and
overrides Hydra saved (`.hydra/`), the TensorBoard scalars, the planned schedule and the
measured timeline (`timeline.json`, from `trainer.profile`). Nothing here needs the run's
process, its devices or TensorFlow's runtime."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Any

from chain.errors import ChainError, first_line
from chain.pipeline import schedule_file, schedules
from chain.report import scalars


@dataclass
class RunRecord:
    """One run directory's results (any of them may be missing: a killed run has no summary)."""

    path: str
    summary: dict | None = None
    config: str = ""
    overrides: list[str] = field(default_factory=list)
    curves: dict[str, dict[str, scalars.Series]] = field(default_factory=dict)
    timeline: dict | None = None

    @property
    def name(self) -> str:
        return os.path.basename(os.path.normpath(self.path))

    @property
    def stages(self) -> list[dict]:
        return (self.summary or {}).get("stages", [])

    def get(self, key: str, default: Any = None) -> Any:
        return (self.summary or {}).get(key, default)

    def stage_writers(self) -> list[str]:
        """`stage_00`, `stage_01`, ...: one per stage (from the summary, else the TensorBoard writers)."""
        if self.stages:
            return [f"stage_{s['index']:02d}" for s in self.stages]
        return [w for w in sorted(self.curves) if w.startswith("stage_")]

    def schedule(self) -> schedules.Schedule | None:
        """The pipeline schedule the run followed (mode=e2e), rebuilt from its summary."""
        name, m = self.get("schedule"), self.get("microbatches")
        if not name or not m or not self.stages:
            return None
        if name == schedules.FILE:  # read again from its file, if it is still there and still runs
            try:
                return schedule_file.read(self.get("schedule_file") or "", len(self.stages), m)
            except schedule_file.ScheduleFileError:
                return None
        devices = self.get("schedule_devices") if name == "interleaved" else None
        try:
            return schedules.build(name, len(self.stages), m, devices)
        except ValueError:  # a summary edited into a schedule that cannot be built
            return None


# The keys of summary.json the report reads and the types a run writes (None: not filled in). A
# file edited or damaged into other types is refused naming the key, not drawn as something else.
_NUMBER = (int, float)
SUMMARY_TYPES: dict[str, type | tuple[type, ...]] = {
    "mode": str, "strategy": str, "schedule": str, "schedule_file": str, "schedule_devices": int, "microbatches": int, "batch_size": int, "steps": int,
    "resumed_from": int,
    "stages": list, "replica_devices": list, "replica_peak_memory_bytes": list, "peak_memory_scope": str,
    "examples_per_second": _NUMBER, "examples_per_step": _NUMBER, "loss_first": _NUMBER, "loss_last": _NUMBER,
    "bubble_fraction": _NUMBER, "measured_bubble_fraction": _NUMBER}
STAGE_TYPES: dict[str, type | tuple[type, ...]] = {
    "index": int, "device": str, "physical": str, "params": int, "model": str, "peak_memory_bytes": _NUMBER,
    "busy_fraction": _NUMBER}


def _read(path: str) -> str | None:
    """The text of `path` (None: no such file); a file that is not UTF-8 text is a ChainError naming it."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        return None
    except OSError as e:
        raise ChainError(f"{path} cannot be read: {e.strerror or e}") from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ChainError(f"{path} is damaged: not UTF-8 text (byte {data[e.start]:#04x} at "
                         f"offset {e.start})") from None


def _typed(value: Any, types: type | tuple[type, ...]) -> bool:
    """True when `value` is None or one of `types` (a bool is no number here)."""
    return value is None or (isinstance(value, types) and not isinstance(value, bool))


def _json(path: str) -> Any:
    """The JSON document in `path` (None: no such file, or empty); a ChainError naming the file."""
    text = _read(path)
    if not text:
        return None
    try:
        return json.loads(text)
    except ValueError as e:
        raise ChainError(f"{path} is not valid JSON ({e})") from None


def _check_summary(summary: Any, path: str) -> dict:
    """`summary` if it has the shape a run writes, else a ChainError naming the file and the key."""
    def wrong(key: str, want: str) -> ChainError:
        return ChainError(f"{path} is not a summary chain wrote: {key} must be {want}")

    if not isinstance(summary, dict):
        raise wrong("the document", "a JSON object")
    for key, types in SUMMARY_TYPES.items():
        if not _typed(summary.get(key), types):
            raise wrong(key, f"{'a number' if types is _NUMBER else f'a {types.__name__}'} or null, "
                             f"not {json.dumps(summary[key])[:40]}")
    if summary.get("schedule") is not None and summary["schedule"] not in schedules.CHOICES:
        raise wrong("schedule", f"one of {', '.join(schedules.CHOICES)}")
    m, batch = summary.get("microbatches"), summary.get("batch_size")
    if m is not None and not (isinstance(batch, int) and 1 <= m <= batch):  # a run's divide its batch
        raise wrong("microbatches", "between 1 and batch_size")
    if not all(isinstance(d, str) for d in summary.get("replica_devices") or []):
        raise wrong("replica_devices", "a list of device names")
    for k, stage in enumerate(summary.get("stages") or []):
        if not isinstance(stage, dict) or not isinstance(stage.get("index"), int):
            raise wrong(f"stages[{k}]", "an object with an integer index")
        for key, types in STAGE_TYPES.items():
            if not _typed(stage.get(key), types):
                raise wrong(f"stages[{k}].{key}", f"{'a number' if types is _NUMBER else f'a {types.__name__}'} "
                                                  f"or null, not {json.dumps(stage[key])[:40]}")
    return summary


def _overrides(path: str) -> list[str]:
    """The overrides Hydra saved in `path` (a YAML list of strings); a ChainError naming the file."""
    import yaml

    text = _read(path)
    if not text:
        return []
    try:
        found = yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark else ""
        raise ChainError(f"{path} is not valid YAML ({getattr(e, 'problem', None) or first_line(e, typed=False)}{where})"
                         ) from None
    if found is None:
        return []
    if not isinstance(found, list) or not all(isinstance(o, str) for o in found):
        raise ChainError(f"{path} is not a file Hydra wrote: it must be a list of overrides (strings)")
    return found


def load(path: str) -> RunRecord:
    """A run directory's record; a ChainError when `path` holds no run, or a file of it is not what a
    run writes (the message names the file)."""
    if not os.path.isdir(path):
        raise ChainError(f"{path}: no such directory")
    rec = RunRecord(path)
    summary = _json(os.path.join(path, "summary.json"))
    rec.summary = None if summary is None else _check_summary(summary, os.path.join(path, "summary.json"))
    timeline = _json(os.path.join(path, "timeline.json"))
    if timeline is not None and not isinstance(timeline, dict):
        raise ChainError(f"{os.path.join(path, 'timeline.json')} is not a timeline chain wrote: not a JSON object")
    rec.timeline = timeline
    rec.config = _read(os.path.join(path, ".hydra", "config.yaml")) or ""
    rec.overrides = _overrides(os.path.join(path, ".hydra", "overrides.yaml"))
    rec.curves = scalars.read_run(path)
    if rec.summary is None and not rec.curves:
        raise ChainError(f"{path} is not a run directory: it has neither summary.json nor TensorBoard logs (tb/)")
    return rec
