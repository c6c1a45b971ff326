"""`placement.plan=auto`'s search: every candidate plan predicted from measured costs, best first.

`Costs` (`chain.records.auto_plan`) is what the measuring found (`chain.autoplan.measure`): per link of the model (a cut
model's links between the cuts plan=auto takes, several tensors crossing some, or a built-in model's stages) and per measured microbatch
size, the forward (F), input-gradient (B) and weight-gradient (W) seconds; each link's update, the
bytes per example crossing a cut after it, its parameters; a fixed cost per action and per step;
the transfer between two devices and the copies' gradient exchange (seconds per byte and latency);
and which physical device is behind each device of the pool.

`candidates` enumerates the plans (copies R, stages K, the cut, microbatches M, schedule, recompute;
only legal combinations), `predict` plays each one's schedule on those costs (`step_and_bubble`), and
`search` ranks them by predicted step among those the memory estimate says fit (`peaks`, given by
the caller: `chain.autoplan.choice` asks the estimate). Pure: no TensorFlow.
"""

from __future__ import annotations

import contextlib
import gc
import time
from dataclasses import dataclass
from typing import Callable, Mapping, Sequence

from chain.config.shapes import human
from chain.errors import ConfigError
from chain.planning import balance
from chain.records.auto_plan import AutoPlan, Candidate, Costs, Prediction
from chain.schedule import schedules
from chain.schedule.schedules import Action, Schedule

FLOAT_BYTES = 4
VIRTUAL = 2  # stages per device plan=auto tries for a looped schedule (`pipeline.virtual_stages`)
RECOMPUTES = ("never", "except_last", "always")
SHOWN = 5  # predictions kept in AutoPlan.ranked
# What the run's loop adds to each step outside the compiled step (reading the batch, the step's report,
# the bookkeeping); how it was found: docs/benchmarks-in-code.md.
LOOP_S = 4e-4
TIE = 0.02  # predictions this close to the best are taken as equal (the measuring's noise is larger)


@dataclass(frozen=True)
class StageTimes:
    """One stage's seconds per action at the candidate's microbatch: F, B (input gradient), W (weight
    gradients), its update, and the bytes per microbatch crossing the cut after it."""

    forward: float
    input_grad: float
    weight_grad: float
    update: float
    out_bytes: int
    params: int


def stage_times(costs: Costs, bounds: Sequence[int], size: int) -> list[StageTimes]:
    """Each stage's `StageTimes`: stage k holds links [bounds[k], bounds[k+1])."""
    out = []
    for a, b in zip(bounds, bounds[1:]):
        js = range(a, b)
        out.append(
            StageTimes(
                sum(costs.at(costs.forward, j, size) for j in js),
                sum(costs.at(costs.input_grad, j, size) for j in js),
                sum(costs.at(costs.weight_grad, j, size) for j in js),
                costs.update_s + sum(costs.update[j] for j in js),
                costs.crossing[b - 1] * size * FLOAT_BYTES,
                sum(costs.params[j] for j in js),
            )
        )
    return out


def step_and_bubble(
    schedule: Schedule,
    times: Sequence[StageTimes],
    costs: Costs,
    *,
    replicas: int = 1,
    recompute: str = "never",
    grad_accum: int = 1,
    rows_physical: Sequence[Sequence[str]] | None = None,
) -> tuple[float, float]:
    """(predicted step seconds, bubble) of `replicas` copies of `schedule` with `times` per stage: the
    schedule played (`schedules.play_timed`) with each action's cost (`action_cost`: a fixed cost per
    action, the recomputed forwards), a transfer on each crossing between devices, and devices that
    share a physical device (`rows_physical[r][d]`: copy r's device d's) running one action at a time;
    then each stage's update after its last action (after the copies' gradient exchange: `_updates`)
    and the step's fixed cost."""
    n_rows = len(schedule.actions)
    phys = [rows_physical[r][d] if rows_physical else f"{r}:{d}" for r in range(replicas) for d in range(n_rows)]

    def crossing(needed: Action, action: Action) -> float:
        if schedule.row(needed.stage) == schedule.row(action.stage):
            return 0.0
        lo = min(needed.stage, action.stage)
        return costs.transfer_latency_s + times[lo].out_bytes * costs.transfer_s_per_byte

    timed = schedules.play_timed(
        schedule,
        action_cost(schedule, times, costs, recompute),
        grad_accum=grad_accum,
        copies=replicas,
        wait=crossing,
        shared=phys,
    )
    free, busy = _updates(schedule, times, costs, timed, phys, replicas)
    span = max(free)
    bubble = (1 - sum(busy) / (len(free) * span)) if span else 0.0
    return span + costs.step_s + LOOP_S, bubble


def action_cost(
    schedule: Schedule, times: Sequence[StageTimes], costs: Costs, recompute: str
) -> Callable[[Action], float]:
    """An action's predicted seconds: its stage's F, B (with W in a whole backward) or W, the fixed cost
    per action, and a backward's recomputed forward (`recompute`; never where the backward follows its
    forward at once, `schedules.backward_at_once`, nor on the last microbatch under except_last)."""
    split = schedules.is_split(schedule)
    m = schedule.microbatches
    at_once = schedules.backward_at_once(schedule)

    def took(a: Action) -> float:
        t = times[a.stage]
        if a.kind == schedules.FORWARD:
            return t.forward + costs.action_s
        if a.kind == schedules.WEIGHT:
            return t.weight_grad + costs.action_s
        own = a.microbatch % m
        again = recompute != "never" and (a.stage, own) not in at_once and (recompute == "always" or own != m - 1)
        return t.input_grad + (0.0 if split else t.weight_grad) + (t.forward if again else 0.0) + costs.action_s

    return took


def _updates(
    schedule: Schedule,
    times: Sequence[StageTimes],
    costs: Costs,
    timed: schedules.Timed,
    phys: Sequence[str],
    replicas: int,
) -> tuple[list[float], list[float]]:
    """Each played row's end and busy time once every stage has applied its update: after its last
    action in every copy and, with copies, the exchange of its device's gradients; in order of readiness,
    each when its row and its physical device are free."""
    n_rows = len(schedule.actions)
    free, busy = list(timed.row_ends), list(timed.busy)
    phys_free: dict[str, float] = dict.fromkeys(phys, 0.0)
    for i, p in enumerate(phys):
        phys_free[p] = max(phys_free[p], free[i])
    last: dict[int, float] = {}
    for row in timed.rows:
        for a in row:
            last[a.stage] = max(last.get(a.stage, 0.0), timed.end[a])
    updates = []
    for row in range(n_rows):
        stages = schedule.row_stages(row)
        ready = {k: last[k] for k in stages}
        if replicas > 1:
            # a device's stages exchange their gradients together, after its last action: the exchange was measured
            # as the time it adds to a step beyond the backward it overlaps (`Costs`), so a stage whose backward
            # ends before its device's last does not overlap it again
            exchanged = (
                max(ready.values())
                + costs.exchange_latency_s
                + sum(times[k].params for k in stages) * FLOAT_BYTES * costs.exchange_s_per_byte
            )
            ready = dict.fromkeys(stages, exchanged)
        for k in stages:
            for r in range(replicas):
                updates.append((ready[k], r * n_rows + row, times[k].update))
    for ready, i, d in sorted(updates):
        start = max(ready, free[i], phys_free[phys[i]])
        free[i] = phys_free[phys[i]] = start + d
        busy[i] += d
    return free, busy


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def cut_for(costs: Costs, n_stages: int, size: int) -> list[int] | None:
    """Links per stage for `n_stages` stages: `chain.planning.balance.partition` on each link's
    measured F + B + W at microbatch `size` (the slowest stage paces a pipeline); every stage holds
    weights. None when the links do not make that many stages."""
    n = len(costs.links)
    if n_stages > n:
        return None
    row = [
        costs.at(costs.forward, j, size) + costs.at(costs.input_grad, j, size) + costs.at(costs.weight_grad, j, size)
        for j in range(n)
    ]
    return balance.partition([row] * n_stages, n_stages, list(range(1, n)), weights=list(costs.params))


def candidates(
    costs: Costs, batch: int, stages: Sequence[int], max_microbatches: int = 64
) -> list[tuple[Candidate, list[int]]]:
    """Every legal plan on `costs.devices` for a global batch of `batch`, with K among `stages`: (the
    candidate, its stage bounds in links). R copies x the devices a copy uses <= the pool; R divides
    the batch, M the copy's share (at most `max_microbatches`); each schedule plan=auto tries
    (`schedules.searched`) where its placement takes K stages (`_of_schedule`)."""
    out = []
    for k in stages:
        for r in _divisors(batch):
            share = batch // r
            for m in [d for d in _divisors(share) if d <= max_microbatches]:
                if costs.fixed_cut:
                    sizes = [1] * k
                else:
                    sizes = cut_for(costs, k, share // m)
                    if sizes is None:
                        continue
                bounds = [0, *balance.sizes_to_cuts(sizes), sum(sizes)]
                split = (
                    None
                    if costs.fixed_cut
                    else tuple(costs.links[b - 1][1] - costs.links[a][0] for a, b in zip(bounds, bounds[1:]))
                )
                for name in schedules.searched():
                    out += [(c, bounds) for c in _of_schedule(costs, name, k, m, r, split)]
    return out


def per_device(name: str | None = None) -> int:
    """The stages schedule `name` puts on each device in plan=auto's plans (a looped one: `VIRTUAL`);
    without `name`, the most any schedule plan=auto tries puts on one."""
    if name is None:
        return max(per_device(n) for n in schedules.searched())
    return schedules.BUILDERS[name].per_device or VIRTUAL


def _of_schedule(
    costs: Costs, name: str, k: int, m: int, replicas: int, split: tuple[int, ...] | None
) -> list[Candidate]:
    """Schedule `name`'s plans of K stages, M microbatches and `replicas` copies: none where its row of
    `schedules.BUILDERS` does not take K stages (two or `VIRTUAL` stages a device need a multiple of
    them) or the copies need more devices than the pool; else one per recompute policy it takes (a split
    backward: never; one stage: its only backward follows its forward at once)."""
    row = schedules.BUILDERS[name]
    per = per_device(name)
    per_copy = k // per
    if k % per or k < per or replicas * per_copy > len(costs.devices):
        return []
    try:
        schedule = schedules.build(name, k, m, per_copy)
    except ValueError:
        return []
    virtual = per if row.rows is schedules.Rows.LOOP else 1
    devices = _devices(costs, schedule, replicas)
    policies = ("never",) if row.split or k == 1 else RECOMPUTES
    return [Candidate(replicas, k, m, name, rc, virtual, split, devices) for rc in policies]


def _devices(costs: Costs, schedule: Schedule, replicas: int) -> tuple[str, ...] | None:
    """`placement.devices` of a one-copy plan: stage k on the pool's device of its schedule row (None
    with copies: the planner's own, one device per copy's stage)."""
    if replicas > 1:
        return None
    return tuple(costs.devices[schedule.row(s)] for s in range(schedule.stages))


def used_devices(costs: Costs, c: Candidate, schedule: Schedule) -> list[list[str]]:
    """Copy r's device of each schedule row: the pool's devices, copy after copy."""
    d = schedule.devices
    return [
        [costs.devices[r * d + i] if c.devices is None else c.devices[schedule.row_stages(i)[0]] for i in range(d)]
        for r in range(c.replicas)
    ]


def predict(
    costs: Costs,
    c: Candidate,
    bounds: Sequence[int],
    batch: int,
    *,
    grad_accum: int = 1,
    peaks: Callable[[Candidate, Schedule], Sequence[int]] | None = None,
    memory: Mapping[str, int | None] | None = None,
) -> Prediction:
    """`c`'s predicted step (its schedule played on `costs`), bubble, and each used device's estimated
    peak (`peaks(c, schedule)`: per stage, bytes; stages sharing a device add up) against its memory."""
    schedule = schedules.build(c.schedule, c.stages, c.microbatches, c.stages // c.virtual_stages)
    size = batch // c.replicas // c.microbatches
    times = stage_times(costs, bounds, size)
    where = used_devices(costs, c, schedule)
    physical = dict(zip(costs.devices, costs.physical))
    step, bubble = step_and_bubble(
        schedule,
        times,
        costs,
        replicas=c.replicas,
        recompute=c.recompute,
        grad_accum=grad_accum,
        rows_physical=[[physical.get(d, d) for d in row] for row in where],
    )
    per_stage = list(peaks(c, schedule)) if peaks else [0] * c.stages
    flat = [d for row in where for d in row]
    totals = {d: 0 for d in flat}
    for row in where:
        for i, d in enumerate(row):
            totals[d] += sum(per_stage[k] for k in schedule.row_stages(i))
    mem = memory or {}
    return Prediction(c, step, bubble, tuple(totals.values()), tuple(mem.get(d) for d in totals), batch * grad_accum)


def search(
    costs: Costs,
    batch: int,
    stages: Sequence[int],
    *,
    grad_accum: int = 1,
    peaks: Callable[[Candidate, Schedule], Sequence[int]] | None = None,
    memory: Mapping[str, int | None] | None = None,
    max_microbatches: int = 64,
) -> AutoPlan:
    """Every candidate predicted, those over a device's memory dropped, the rest ranked by predicted
    step (ties: fewer devices, fewer microbatches, the simpler schedule, less recompute: the order
    `candidates` lists them in). Nothing fits: a ConfigError naming the smallest shortfall."""
    started = time.perf_counter()
    with _collections_paused():
        found = [
            predict(costs, c, b, batch, grad_accum=grad_accum, peaks=peaks, memory=memory)
            for c, b in candidates(costs, batch, stages, max_microbatches)
        ]
    if not found:
        raise ConfigError(
            f"placement.plan=auto: no plan of {', '.join(map(str, stages))} stages runs on the "
            f"{len(costs.devices)} device(s) {', '.join(costs.devices)} with data.batch_size={batch}"
        )
    fitting = [p for p in found if p.fits]
    if not fitting:
        raise ConfigError(refusal(found, batch))
    ranked = sorted(fitting, key=lambda p: p.step_s)  # stable: ties keep `candidates`' order
    best = ranked[0].step_s
    # within TIE of the best is within the prediction's error: the simplest such plan (fewest stages, copies and
    # microbatches, the plainest schedule, least recompute: the order `candidates` lists them in) is chosen
    chosen = next(p for p in fitting if p.step_s <= best * (1 + TIE))
    ranked = [chosen, *(p for p in ranked if p is not chosen)]
    return AutoPlan(
        chosen,
        tuple(ranked[:SHOWN]),
        len(found),
        len(found) - len(fitting),
        costs.measuring_s,
        time.perf_counter() - started,
    )


@contextlib.contextmanager
def _collections_paused():
    """Python's garbage collector off while the schedules are played: they make many small short-lived objects, and
    in a process holding TensorFlow's and Keras' objects each collection walks them all (the cost:
    docs/benchmarks-in-code.md); what the plays make holds no cycles."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def refusal(found: Sequence[Prediction], batch: int) -> str:
    """No candidate fits: one line naming the closest plan, its device and the bytes it lacks, and what
    would fit."""
    closest = min(found, key=lambda p: p.shortfall)
    i = max(
        range(len(closest.peaks)),
        key=lambda j: closest.peaks[j] - (closest.memory[j] if closest.memory[j] is not None else closest.peaks[j]),
    )
    devices = used_devices_of(closest)
    device = devices[i] if i < len(devices) else f"device {i}"
    return (
        f"placement.plan=auto: no plan fits the devices' memory; the closest ({' '.join(closest.candidate.overrides())}) "
        f"needs about {human(closest.peaks[i])} on {device}, {human(closest.shortfall)} more than its "
        f"{human(closest.memory[i])}; it would fit with a smaller data.batch_size (at most about "
        f"{_smaller(closest, batch)}), more devices (or more memory per device: placement.memory_limit_mb), or a "
        "smaller model"
    )


def used_devices_of(p: Prediction) -> list[str]:
    """The devices a prediction's peaks are listed for (its candidate's, or numbered when planned)."""
    c = p.candidate
    return list(dict.fromkeys(c.devices)) if c.devices is not None else [f"device {i}" for i in range(len(p.peaks))]


def _smaller(p: Prediction, batch: int) -> int:
    """A rough batch that would fit: the batch scaled by the tightest device's memory over its peak."""
    ratios = [m / peak for peak, m in zip(p.peaks, p.memory) if m is not None and peak > 0]
    return max(1, int(batch * min(ratios, default=1.0)))
