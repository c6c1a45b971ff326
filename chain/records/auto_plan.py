"""`placement.plan=auto`'s records (`chain.autoplan`): what it measured (`Costs`), the key of what those
measurements depend on and RUN_DIR/plan_costs.json (`CostKey`, `CostFile`, `CacheUse`: what a run found there),
a candidate plan and its prediction (`Candidate`, `Prediction`), and the search's outcome (`AutoPlan`, kept on
the `RunSpec`).

A candidate is one way to run the user's model and global batch: copies of the pipeline, stages
and where to cut, microbatches, schedule and recompute. Each is written as the command-line
overrides that run it by hand (`Candidate.overrides`): a run with `placement.plan=auto` is the run
those overrides make, nothing more. No TensorFlow here (the planner reads these before it starts).
"""

from __future__ import annotations

import bisect
import hashlib
import json
from dataclasses import dataclass
from typing import Sequence

from chain.records import serial
from chain.records.serial import item


@dataclass(frozen=True)
class Costs:
    """What `placement.plan=auto` measured (`chain.autoplan.measure`). `links[j]`: layers [a, b) of link j
    (a built-in model: stage j, `fixed_cut`); `sizes`: the microbatch sizes measured; `forward[j][i]`,
    `input_grad[j][i]`, `weight_grad[j][i]`: link j's seconds at `sizes[i]`; `update[j]`: its optimizer
    update's seconds; `crossing[j]`: values per example leaving link j (every tensor a cut after it sends:
    activations, ids, masks); `params[j]`: its parameters; `action_s`/`step_s`: fixed costs per action and
    per step; `update_s`: a stage's update's fixed cost (`update[j]` is link j's share by its weights); `transfer_*`,
    `exchange_*`: seconds per byte and latency of a copy between two devices and of the copies' gradient
    exchange (what it adds to a step beyond the backward it overlaps, per byte of a device's gradients);
    `devices`: the pool the plans draw from, `physical[i]`: the physical device behind `devices[i]`
    (devices sharing one run their actions one at a time); `notes`: what the measuring cut."""

    links: tuple[tuple[int, int], ...]
    sizes: tuple[int, ...]
    forward: tuple[tuple[float, ...], ...]
    input_grad: tuple[tuple[float, ...], ...]
    weight_grad: tuple[tuple[float, ...], ...]
    update: tuple[float, ...]
    crossing: tuple[int, ...]
    params: tuple[int, ...]
    action_s: float
    update_s: float
    step_s: float
    transfer_s_per_byte: float
    transfer_latency_s: float
    exchange_s_per_byte: float
    exchange_latency_s: float
    devices: tuple[str, ...]
    physical: tuple[str, ...]
    fixed_cut: bool = False
    measuring_s: float = 0.0
    notes: tuple[str, ...] = ()

    def at(self, row: Sequence[Sequence[float]], j: int, size: int) -> float:
        """Link j's seconds of `row` (forward, input_grad, weight_grad) at microbatch `size`: measured,
        or linear between the two nearest sizes (beyond them: the nearest two's line, never below
        the nearest's per-example cost scaled down)."""
        values, sizes = row[j], self.sizes
        if len(sizes) == 1:
            return values[0] * size / sizes[0]
        i = min(max(bisect.bisect_left(sizes, size), 1), len(sizes) - 1)
        (s0, s1), (v0, v1) = (sizes[i - 1], sizes[i]), (values[i - 1], values[i])
        out = v0 + (v1 - v0) * (size - s0) / (s1 - s0)
        return max(out, min(v0, v1) * min(1.0, size / min(s0, s1)), 0.0)


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
    """A candidate's predicted step (seconds: its schedule played on the measured times, with the
    transfers and the copies' exchange), its bubble (the idle share of its devices in that play),
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
    """What plan=auto found in RUN_DIR/plan_costs.json (`chain.autoplan.cache`): this run's key (`key`,
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


@dataclass(frozen=True)
class CostKey:
    """Everything plan=auto's measurements depend on: two runs with equal keys would measure the same."""

    model: str = item(
        "a digest of the model's structure and its weights' shapes (a cut model's layers, their "
        "configurations, outputs and cuts; a built-in model's stages as the config gives them)"
    )
    input_shape: tuple[int, ...] = item("the shape of one example")
    batch_size: int = item("data.batch_size: the global batch the plans cut")
    sizes: tuple[int, ...] = item("the microbatch sizes measured (every size a candidate may run)")
    devices: tuple[str, ...] = item("the pool of devices the plans draw from")
    physical: tuple[str, ...] = item("the physical device behind each of `devices`")
    settings: str = item("the settings the measuring reads: the optimizer, placement.plan_budget_s")
    tensorflow: str = item("TensorFlow's version")
    keras: str = item("Keras' version")
    chain: str = item("chain's version")

    @property
    def digest(self) -> str:
        """Twelve hex digits naming the key (in log lines)."""
        return digest(serial.to_json(self))[:12]


@dataclass(frozen=True)
class CostFile:
    """RUN_DIR/plan_costs.json: the measurements, their key, and the run that measured them."""

    key: CostKey | None = item("what the measurements depend on (None: a file written before keys)", default=None)
    measured_by: str | None = item("the run that measured them: when, its process and its model", default=None)
    costs: Costs | None = item("the measurements", default=None)


def digest(value: object) -> str:
    """A SHA-256 of `value` as JSON (keys sorted; a value JSON does not know by its `str`)."""
    return hashlib.sha256(json.dumps(value, sort_keys=True, default=str).encode()).hexdigest()
