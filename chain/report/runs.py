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
from chain.schedule import schedule_file, schedules
from chain.records.measured import MeasuredTimeline
from chain.records.serial import RecordError, from_json
from chain.records.summaries import MirroredFields, PipelineFields, ProfileFields, StageSummary, Summary
from chain.report import scalars


@dataclass
class RunRecord:
    """One run directory's results (any of them may be missing: a killed run has no summary), read
    back through the records the run wrote them from (`chain.records`)."""

    path: str
    summary: Summary | None = None
    config: str = ""
    overrides: list[str] = field(default_factory=list)
    curves: dict[str, dict[str, scalars.Series]] = field(default_factory=dict)
    timeline: MeasuredTimeline | None = None

    @property
    def name(self) -> str:
        return os.path.basename(os.path.normpath(self.path))

    @property
    def stages(self) -> list[StageSummary]:
        return (self.summary.stages if self.summary else None) or []

    @property
    def facts(self) -> Summary:
        """The summary, or an empty one (every field None) when the run wrote none."""
        return self.summary or EMPTY

    @property
    def pipeline(self) -> PipelineFields:
        """The schedule's fields (every one None: the run had no schedule)."""
        return self.facts.pipeline or PipelineFields(None, None, None)

    @property
    def mirrored(self) -> MirroredFields:
        return self.facts.mirrored or MirroredFields(None, None, None)

    @property
    def profile(self) -> ProfileFields:
        return self.facts.profile or ProfileFields(None, None, None, None)

    def stage_writers(self) -> list[str]:
        """`stage_00`, `stage_01`, ...: one per stage (from the summary, else the TensorBoard writers)."""
        if self.stages:
            return [f"stage_{s.index:02d}" for s in self.stages]
        return [w for w in sorted(self.curves) if w.startswith("stage_")]

    def schedule(self) -> schedules.Schedule | None:
        """The pipeline schedule the run followed (mode=e2e): the schedule its summary names, for
        its stages and microbatches."""
        name, m = self.pipeline.schedule, self.pipeline.microbatches
        if not name or not m or not self.stages:
            return None
        if name == schedules.FILE:  # read again from its file, if it is still there and still runs
            try:
                return schedule_file.read(self.pipeline.schedule_file or "", len(self.stages), m)
            except schedule_file.ScheduleFileError:
                return None
        try:  # the devices a looped schedule's stages share (the other schedules place theirs themselves)
            return schedules.build(name, len(self.stages), m, self.pipeline.schedule_devices)
        except ValueError:  # a summary edited into a schedule that cannot be built
            return None


EMPTY = from_json(Summary, {})


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
        raise ChainError(f"{path} is damaged: not UTF-8 text (byte {data[e.start]:#04x} at offset {e.start})") from None


def _json(path: str) -> Any:
    """The JSON document in `path` (None: no such file, or empty); a ChainError naming the file."""
    text = _read(path)
    if not text:
        return None
    try:
        return json.loads(text)
    except ValueError as e:
        raise ChainError(f"{path} is not valid JSON ({e})") from None


def _check_summary(raw: Any, path: str) -> Summary:
    """The summary `raw` holds if it has the shape a run writes, else a ChainError naming the file and the key."""

    def wrong(key: str, want: str) -> ChainError:
        return ChainError(f"{path} is not a summary chain wrote: {key} must be {want}")

    try:
        summary = from_json(Summary, raw)
    except RecordError as e:
        raise ChainError(f"{path} is not a summary chain wrote: {e}") from None
    pipeline = summary.pipeline
    known = (*schedules.BUILDERS, schedules.FILE)  # a schedule file's run names `file` (`RunRecord.schedule` reads it)
    if pipeline is not None and pipeline.schedule is not None and pipeline.schedule not in known:
        raise wrong("schedule", f"one of {', '.join(known)}")
    m, batch = pipeline.microbatches if pipeline else None, summary.batch_size
    if m is not None and not (batch is not None and 1 <= m <= batch):  # a run's divide its batch
        raise wrong("microbatches", "between 1 and batch_size")
    for k, stage in enumerate(summary.stages or []):
        if stage.index is None:
            raise wrong(f"stages[{k}]", "an object with an integer index")
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
        raise ChainError(
            f"{path} is not valid YAML ({getattr(e, 'problem', None) or first_line(e, typed=False)}{where})"
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
    try:
        rec.timeline = None if timeline is None else from_json(MeasuredTimeline, timeline)
    except RecordError as e:
        raise ChainError(f"{os.path.join(path, 'timeline.json')} is not a timeline chain wrote: {e}") from None
    rec.config = _read(os.path.join(path, ".hydra", "config.yaml")) or ""
    rec.overrides = _overrides(os.path.join(path, ".hydra", "overrides.yaml"))
    rec.curves = scalars.read_run(path)
    if rec.summary is None and not rec.curves:
        raise ChainError(f"{path} is not a run directory: it has neither summary.json nor TensorBoard logs (tb/)")
    return rec
