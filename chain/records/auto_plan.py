"""`placement.plan=auto`'s records: a candidate plan, its prediction, and the search's outcome.

A candidate is one way to run the user's model and global batch: copies of the pipeline, stages
and where to cut, microbatches, schedule and recompute. Each is written as the command-line
overrides that run it by hand (`Candidate.overrides`): a run with `placement.plan=auto` is the run
those overrides make, nothing more. No TensorFlow here (the planner reads these before it starts).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Candidate:
    """One plan: `replicas` copies of a pipeline of `stages` stages cut after `split` layers per stage
    (None: the stages the config defines, not a cut model), `microbatches` per copy's batch,
    `schedule` (with `virtual_stages` stages per device for a looped one, interleaved; else 1), `recompute`, and
    `devices`: each used device, copy after copy (None: the planner's own choice)."""

    replicas: int
    stages: int
    microbatches: int
    schedule: str
    recompute: str = "never"
    virtual_stages: int = 1
    split: tuple[int, ...] | None = None
    devices: tuple[str, ...] | None = None

    def overrides(self) -> tuple[str, ...]:
        """The command-line overrides that run this plan by hand (with the user's own)."""
        out = [
            f"+stages={self.stages}",
            f"pipeline.microbatches={self.microbatches}",
            f"pipeline.schedule={self.schedule}",
            f"pipeline.recompute={self.recompute}",
        ]
        if self.virtual_stages != 1:  # a looped schedule's stages per device
            out.append(f"pipeline.virtual_stages={self.virtual_stages}")
        if self.replicas > 1:
            out.append(f"placement.replicas={self.replicas}")
        if self.split is not None:
            out.append("placement.split=[" + ",".join(map(str, self.split)) + "]")
        if self.devices is not None:
            out.append("placement.devices=[" + ",".join(self.devices) + "]")
        return tuple(out)


@dataclass(frozen=True)
class Prediction:
    """A candidate's predicted step (seconds: its schedule replayed on the measured times, with the
    transfers and the copies' exchange), its bubble (the idle share of its devices in that replay),
    each used device's estimated peak and memory (bytes; None: no limit known), and whether it fits."""

    candidate: Candidate
    step_s: float
    bubble: float
    peaks: tuple[int, ...]
    memory: tuple[int | None, ...]
    examples_per_step: int

    @property
    def fits(self) -> bool:
        """True when every device's estimated peak is within its memory (or its memory is unknown)."""
        return all(m is None or p <= m for p, m in zip(self.peaks, self.memory))

    @property
    def shortfall(self) -> int:
        """Bytes the tightest device lacks (0: fits)."""
        return max([p - m for p, m in zip(self.peaks, self.memory) if m is not None] + [0])

    @property
    def examples_per_s(self) -> float:
        """The global batch over the predicted step."""
        return self.examples_per_step / self.step_s if self.step_s > 0 else 0.0


@dataclass(frozen=True)
class CacheUse:
    """What plan=auto found in RUN_DIR/plan_costs.json (`chain.planning.cost_cache`): this run's key (`key`,
    its digest), the run that measured the file's costs (`measured_by`; None: unknown), what of their key
    differs from this run's (`differs`, in words: `model`, `batch`, `devices`, `settings`, `versions`, or
    `file`: none could be read; empty: the costs were read), and their key's digest (`their_key`)."""

    key: str
    measured_by: str | None
    differs: tuple[str, ...]
    their_key: str | None = None

    @property
    def read(self) -> bool:
        """Whether the file's costs were read (measured by a run with this run's key)."""
        return not self.differs


@dataclass(frozen=True)
class AutoPlan:
    """What `placement.plan=auto` found: the chosen prediction, the best few (`ranked`, best first, the
    chosen among them), how many candidates were predicted and how many were dropped for memory, and
    the seconds spent measuring (0 when the measurements came from the run directory's cache) and
    searching; `cache`: what the run directory's cache held (None: nothing)."""

    chosen: Prediction
    ranked: tuple[Prediction, ...]
    candidates: int
    dropped_for_memory: int
    measuring_s: float
    searching_s: float
    cached: bool = False
    cache: CacheUse | None = None
