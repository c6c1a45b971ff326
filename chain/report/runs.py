"""What a report shows of one run, read from its directory: summary.json, the config and
overrides Hydra saved (`.hydra/`), the TensorBoard scalars, the planned schedule and the
measured timeline (`timeline.json`, from `trainer.profile`). Nothing here needs the run's
process, its devices or TensorFlow's runtime."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Any

from chain.errors import ChainError
from chain.planning import schedules
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
        return schedules.build(name, len(self.stages), m)


def _read(path: str) -> str | None:
    try:
        with open(path) as f:
            return f.read()
    except FileNotFoundError:
        return None


def load(path: str) -> RunRecord:
    """A run directory's record; a ChainError when `path` holds no run."""
    if not os.path.isdir(path):
        raise ChainError(f"{path}: no such directory")
    rec = RunRecord(path)
    text = _read(os.path.join(path, "summary.json"))
    try:
        rec.summary = json.loads(text) if text else None
        timeline = _read(os.path.join(path, "timeline.json"))
        rec.timeline = json.loads(timeline) if timeline else None
    except ValueError as e:
        raise ChainError(f"{path}: a damaged JSON file ({e})") from None
    rec.config = _read(os.path.join(path, ".hydra", "config.yaml")) or ""
    overrides = _read(os.path.join(path, ".hydra", "overrides.yaml"))
    if overrides:
        import yaml

        rec.overrides = [str(o) for o in (yaml.safe_load(overrides) or [])]
    rec.curves = scalars.read_run(path)
    if rec.summary is None and not rec.curves:
        raise ChainError(f"{path} is not a run directory: it has neither summary.json nor TensorBoard logs (tb/)")
    return rec
