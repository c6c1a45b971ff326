"""The measured timeline: from a profiler trace of some steps to when each action of the
schedule ran on its stage's device, and what follows (busy time, bubble, copies, the
slowest stage). `chain.training.profile` takes the trace; this module reads it.

**Reading a trace.** TensorFlow's profiler writes `plugins/profile/<session>/<host>.xplane.pb`
under the trace's directory: planes of lines (threads) of events (start, duration) whose
metadata names an op as `op_name:op_type`. An op belongs to the action whose name scope it
carries (`Action.scope`, read back by `Action.parse`: `chain.schedule.schedules`): `s{k}_F{m}/...` is F(k, m); `s{k}_B{m}/...` and the tape's
gradient ops `gradient_tape/s{k}_F{m}/...` are B(k, m); `s{k}_update/...` is stage k's
update; in copy r > 0 of a replicated pipeline each of these names starts with `r{r}_` (`copy_of`), and
every copy's stages are measured, copy 0's first (`row_of`); the host releases (`release_s{k}_...`) and the ops outside every scope (the split
into microbatches, the report) belong to no stage. A step is the interval of its marker
(`MARKER`, with the step's number), which `chain.training.profile` puts around each call.

**An action** runs from its first op's start to its last op's end, on the events of its
stage's device: in a cluster, the trace of that stage's worker (`sources`); in one process,
every event (logical devices share the process's trace). Its copies are the transfer ops
inside it (`_Send`, `_Recv`, `copy_to_*`). Two kinds of op do not mark when an action ran:
variable reads (`READS`), and ops that ran before the action's input existed (before its
`producer`'s last computation, for a forward; before its first copy ran, or it began when it
has none, for a backward, which sends its input gradient before computing its weights'
gradients): a backward's first ops may need only its stage's own activations, and run before
its gradient arrives; a stage's first action waits
on no earlier action of its own, so its weight reads and, on the last stage, the cast of
its labels run as the step starts. (Across machines this assumes clocks that agree better
than a transfer takes.) A stage is *busy* while any of its actions runs
(the union of their intervals); the step's span runs from the first action's start to the
last action's end; the **measured bubble fraction** is the idle share of devices x span (a
device is busy while any of its stages is: interleaved stages share one), the measured
counterpart of the planned one (`Timeline.bubble_fraction`, unit-time actions).
Updates come after the schedule and are reported apart (`update_ms`), as the plan leaves them
out. `copy_wait_ms` is the time a stage sat idle after the input of its next action was
ready on another device: the transfer, and the host round trip of the release, stalling it.

Limits: logical CPU devices of one process share one thread pool, so their actions
interleave on the same cores: the trace shows order and placement, and a stage's busy time
includes time the threads spent on other stages' ops; only separate devices (GPUs, cluster
workers) measure overlap. Events from different hosts are compared on their wall clocks.

No TensorFlow at import: `trace_events` imports the protobuf reader when called.
"""

from __future__ import annotations

import glob
import os
from dataclasses import dataclass
from typing import Any, Callable, Collection, Iterable, Iterator, Sequence

from chain.planning import balance
from chain.records.measured import Advice, MeasuredTimeline, MeasuredAction, MeasuredStep, MeasuredUpdate, StageTime
from chain.schedule.schedules import (
    BACKWARD,
    DONE,
    FORWARD,
    UPDATE,
    WEIGHT,
    Action,
    Schedule,
    rounds,
    simulate,
    update_of,
)

MARKER = "chain_step"  # the profiler event around each profiled step (its `step_num` stat is the step)
SLOW = 0.2  # a stage busier than the mean by more than this share is the bottleneck the advice evens
COPY_TYPES = {"_Send", "_Recv", "_HostSend", "_HostRecv"}
# The name `chain.steps.ops.copy_to` gives a copy (that module imports TensorFlow, this one
# may not: tests/test_structure.py checks that the two agree).
COPY_PREFIX = "copy_to_"
# Ops that only read state: a stage's first action has no previous action to wait on, so its
# variable reads run when the step starts, long before its input arrives; they do not mark
# when an action ran.
READS = {"ReadVariableOp", "VarHandleOp", "Const", "NoOp"}


@dataclass(frozen=True)
class OpEvent:
    """One op's run: `name` (with its scopes), `type`, start and end (ns, the host's wall
    clock) and `source`, the trace file's host (`vm`, `localhost_6009`)."""

    name: str
    type: str
    start: int
    end: int
    source: str


def owner(name: str) -> tuple[str, int, int] | None:
    """Which part of the step an op belongs to, from its name: ("F"|"B"|"W", stage, microbatch),
    ("update", stage, -1), or None (no stage's: a release, the split into microbatches, ...); in
    which copy of the pipeline: `copy_of`."""
    action = Action.parse(name)  # the step's own vocabulary (`Action.scope`), read back
    if action is not None:
        return action.kind, action.stage, action.microbatch
    update = update_of(name)
    return (UPDATE, update[1], -1) if update is not None else None


def copy_of(name: str) -> int:
    """The copy of the pipeline (placement.replicas) an op of `owner` belongs to: 0 without copies."""
    action = Action.parse(name)
    if action is not None:
        return action.replica
    update = update_of(name)
    return update[0] if update is not None else 0


def is_copy(e: OpEvent) -> bool:
    """A transfer between devices (not the control edge to the host that a release waits on)."""
    return (e.type in COPY_TYPES or COPY_PREFIX in e.name) and f"/{DONE}/" not in e.name


# --- reading TensorFlow's trace files ----------------------------------------------------------


def profile_root(logdir: str) -> str:
    """Where TensorFlow's profiler keeps the traces of `logdir`: a folder per session under it."""
    return os.path.join(logdir, "plugins", "profile")


def trace_files(logdir: str) -> list[str]:
    """Every `.xplane.pb` file under `logdir/plugins/profile/`."""
    return sorted(glob.glob(os.path.join(profile_root(logdir), "*", "*.xplane.pb")))


def source_of(path: str) -> str:
    """The host a trace file holds: `localhost_6009` for `.../localhost_6009.xplane.pb`."""
    return os.path.basename(path)[: -len(".xplane.pb")]


def profile_start(space) -> int:
    """When the trace began (ns since the epoch): a file's times count from its own start, so
    traces of several hosts (the client's, each worker's) line up only with it added."""
    return _space_stat(space, "profile_start_time")


def _space_stat(space, name: str) -> int:
    """An integer stat of a trace's planes (`profile_start_time`, `profile_stop_time`), 0 if none has it."""
    for plane in space.planes:
        names = {k: v.name for k, v in plane.stat_metadata.items()}
        for stat in plane.stats:
            if names.get(stat.metadata_id) == name:
                return stat.int64_value or stat.uint64_value
    return 0


@dataclass(frozen=True)
class TraceEvent:
    """One event of a trace file, as `trace_events` reads it: its `name`, the XEvent itself
    (`event`), its line's timestamp (`line_ns`, from the file's start), its plane's stat names
    (`names`, by metadata id), the host it came from (`source`) and the file's start (`origin_ns`,
    ns since the epoch)."""

    name: str
    event: Any
    line_ns: int
    names: dict
    source: str
    origin_ns: int

    @property
    def start_ps(self) -> int:
        """When it began, in ps from the file's start."""
        return self.line_ns * 1000 + self.event.offset_ps

    def stats(self) -> dict[str, Any]:
        """Its stats by name; a string stat is a reference into the stat names (`ref_value`)."""
        return {
            self.names.get(s.metadata_id): (
                self.names.get(s.ref_value, "") if s.ref_value else s.str_value or s.int64_value or s.uint64_value
            )
            for s in self.event.stats
        }

    def step_number(self) -> int | None:
        """The step a `MARKER` event marks (its `step_num` stat), else None."""
        if self.name != MARKER:
            return None
        number = [
            s.int64_value or s.uint64_value for s in self.event.stats if self.names.get(s.metadata_id) == "step_num"
        ]
        return number[0] if number else None


def trace_spans(paths: Iterable[str]) -> dict[str, tuple[int, int]]:
    """Per host (`source_of`), when its trace began and ended (ns since the epoch, its wall clock):
    what it can hold. A step outside a span it needs is not measured (`measure`)."""
    from chain.internals.tf_private import read_xspace

    spans = {}
    for path in paths:
        space = read_xspace(path)
        stop = _space_stat(space, "profile_stop_time") or 2**63  # none: a TensorFlow that does not say
        spans[source_of(path)] = (profile_start(space), stop)
    return spans


def holds(spans: dict[str, tuple[int, int]], source: str, step: tuple[int, int]) -> bool:
    """Whether the trace of `source` (`trace_spans`) holds the marked `step` (start, end) whole."""
    return source in spans and spans[source][0] <= step[0] <= step[1] <= spans[source][1]


def trace_events(paths: Iterable[str]) -> Iterator[TraceEvent]:
    """Every event of the trace files `paths`, file by file, plane by plane, line by line."""
    from chain.internals.tf_private import read_xspace

    for path in paths:
        space = read_xspace(path)
        source, origin = source_of(path), profile_start(space)
        for plane in space.planes:
            names = {k: v.name for k, v in plane.stat_metadata.items()}
            kinds = {k: v.name for k, v in plane.event_metadata.items()}
            for line in plane.lines:
                for e in line.events:
                    yield TraceEvent(kinds.get(e.metadata_id, ""), e, line.timestamp_ns, names, source, origin)


def read_trace(paths: Iterable[str]) -> tuple[list[OpEvent], dict[int, tuple[int, int]]]:
    """The op events of the trace files `paths`, and each marked step's (start, end), in ns since
    the epoch (each host's wall clock)."""
    events, steps = [], {}
    for t in trace_events(paths):
        start = t.origin_ns + t.start_ps // 1000
        end = start + t.event.duration_ps // 1000
        number = t.step_number()
        if number is not None:
            steps[number] = (start, end)
        elif t.name != MARKER and ":" in t.name:
            op, kind = t.name.rsplit(":", 1)
            events.append(OpEvent(op, kind, start, end, t.source))
    return events, steps


# --- from events to actions and statistics ---------------------------------------------------


def producer(a: Action, stages: int) -> Action | None:
    """The action whose result `a` takes: F(k-1, m) for F(k, m); B(k+1, m) for B(k, m), or the
    last stage's own F(m) for its B(m); its own B(k, m) for W(k, m) (a split schedule); None for
    F(0, m), which takes the batch. The same copy of the pipeline's."""
    if a.kind == WEIGHT:
        return a._replace(kind=BACKWARD)
    if a.kind == FORWARD:
        return a._replace(stage=a.stage - 1) if a.stage > 0 else None
    if a.stage < stages - 1:
        return a._replace(stage=a.stage + 1, kind=BACKWARD)
    return a._replace(kind=FORWARD)


def union(intervals: Iterable[tuple[float, float]]) -> float:
    """The length of the union of intervals."""
    total, end = 0.0, None
    for a, b in sorted(intervals):
        if end is None or a > end:
            total, end = total + (b - a), b
        elif b > end:
            total, end = total + (b - end), b
    return total


def row_of(stage: int, replica: int, stages: int) -> int:
    """The row of copy `replica`'s stage `stage` among every copy's stages (copy 0's, then copy 1's, ...)."""
    return replica * stages + stage


def measure(
    schedule: Schedule,
    events: Sequence[OpEvent],
    steps: dict[int, tuple[int, int]],
    devices: Sequence[str],
    sources: Sequence[str | None] | None = None,
    grad_accum: int = 1,
    replicas: int = 1,
    spans: dict[str, tuple[int, int]] | None = None,
    compiled: Collection[int] = (),
) -> MeasuredTimeline:
    """The measured timeline of the marked `steps` (`timeline.json`'s record, see
    docs/measuring.md): every step's actions with their times in ms from the first step's start,
    and per stage its busy time, forward, backward, copy and update times (means per step).

    `replicas` copies of the pipeline (`placement.replicas`): every copy's actions are measured, and
    `devices`, `sources` and the per stage figures hold a row per stage of every copy (`row_of`).
    `sources[row]`: the trace whose events count for that stage (None: every event). A step in which
    some F or B of the schedule has no op is kept but left out of the statistics (`complete`; a W may
    have none: when B took a stage's weight gradients, `chain.pipeline.play.whole_backward`, its first
    W only keeps them as the sums), and so
    is a step that a trace it reads does not hold from its marker's start to its end (`spans`, per
    source: when its trace began and ended; a worker's trace that began late or ended early holds
    part of a step, whose actions would look shorter than they ran), and a step in `compiled`, whose call
    traced and compiled the step function first (its ops ran beside that work, and the first run of a
    function is slower).
    """
    n_stages = schedule.stages
    n_rows = n_stages * replicas
    sources = list(sources) if sources is not None else [None] * n_rows
    order = simulate(schedule).order()  # every action of a step, producers first, in `grad_accum` rounds
    played = [a for c in range(replicas) for a in rounds(order, schedule.microbatches, grad_accum, c)]
    origin = min(start for start, _ in steps.values()) if steps else 0
    ms = lambda ns: (ns - origin) / 1e6  # noqa: E731
    owned = _owned(events, sources, n_stages, replicas)
    used = {s for s in sources if s is not None}  # the traces a complete step needs
    out_steps = []
    for number in sorted(steps):
        lo, hi = steps[number]
        ops: dict[tuple, list[OpEvent]] = {}
        for who, e in owned:
            if lo <= e.start <= hi:
                ops.setdefault(who, []).append(e)
        actions = _actions(played, ops, n_stages, ms)
        updates = [
            MeasuredUpdate(k, ms(min(e.start for e in found)), ms(max(e.end for e in found)), c)
            for c in range(replicas)
            for k in range(n_stages)
            if (found := ops.get((UPDATE, k, -1, c)))
        ]
        held = spans is None or all(holds(spans, s, (lo, hi)) for s in used)
        seen = {a.key() for a in actions}
        whole = all(tuple(a) in seen for a in played if a.kind != WEIGHT)  # see `measure`: a W may have no op
        complete = held and whole and number not in compiled
        out_steps.append(MeasuredStep(number, ms(lo), ms(hi), complete, actions, updates))
    stats = statistics(out_steps, schedule, devices, replicas)
    return MeasuredTimeline(
        schedule.name,
        n_stages,
        schedule.microbatches,
        grad_accum,
        list(devices),
        out_steps,
        simulate(schedule).bubble_fraction,
        stats.measured_bubble_fraction,
        stats.per_stage,
        stats.slowest_stage,
        stats.step_ms,
        replicas=replicas,
    )


def _owned(
    events: Sequence[OpEvent], sources: Sequence[str | None], n_stages: int, replicas: int
) -> list[tuple[tuple, OpEvent]]:
    """Each event of an action or update with its owner, (kind, stage, microbatch, copy): once each (a trace
    holds many events), and only from the trace its stage's row counts (`sources`, see `measure`)."""
    return [
        (who, e)
        for e in events
        if (found := owner(e.name)) is not None
        and (who := (*found, copy_of(e.name)))[1] < n_stages
        and who[3] < replicas
        and sources[row_of(who[1], who[3], n_stages)] in (None, e.source)
    ]


def _actions(
    played: Sequence[Action], ops: dict[tuple, list[OpEvent]], n_stages: int, ms: Callable[[int], float]
) -> list[MeasuredAction]:
    """One step's measured actions, by copy, stage and start: each action of `played` (producers before
    consumers) that has ops in `ops` (the step's events by owner), its times in ms (`ms` of a time in ns)."""
    actions, since = [], {}  # since[a]: when a's result could first be used (ns)
    for a in played:
        found = ops.get((a.kind, a.stage, a.microbatch, a.replica))
        found = [e for e in found or () if e.type not in READS] or found
        p = producer(a, n_stages)
        if found and p in since:  # work done before its input existed is not work on it
            found = [e for e in found if e.start >= since[p]] or found
        if found:
            # A forward's activation exists when its last computation ends; a backward sends its
            # input gradient before it computes its weights' gradients: its result exists once its
            # first copy has run (without one, only its start is sure). A stage's backward whose
            # first ops need only its own activations runs them as soon as that gradient's producer
            # starts, then waits for the gradient: the wait is not work on it.
            compute = [e.end for e in found if not is_copy(e) and "/done" not in e.name]
            sent = [e.end for e in found if is_copy(e)]
            if a.kind == FORWARD and compute:
                since[a] = max(compute)
            elif a.kind == BACKWARD and sent:
                since[a] = min(sent)
            else:
                since[a] = min(e.start for e in found)
            actions.append(
                MeasuredAction(
                    a.stage,
                    a.microbatch,
                    a.kind,
                    ms(min(e.start for e in found)),
                    ms(max(e.end for e in found)),
                    sum(e.end - e.start for e in found if is_copy(e)) / 1e6,
                    len(found),
                    a.replica,
                )
            )
    return sorted(actions, key=lambda a: (a.replica, a.stage, a.start_ms))


def _waits(
    actions: Sequence[MeasuredAction], schedule: Schedule, devices: Sequence[str], replicas: int = 1
) -> list[float]:
    """Per stage (of every copy: `row_of`), the time it sat idle after an input of its next action was
    ready on another device."""
    by = {a.key(): a for a in actions}  # keyed like an Action
    n = schedule.stages
    waits = [0.0] * (n * replicas)
    previous_end: dict[int, float] = {}
    for a in sorted(actions, key=lambda a: a.start_ms):
        k = row_of(a.stage, a.replica, n)
        p = producer(Action(*a.key()), n)
        if p is not None and tuple(p) in by and devices[row_of(p.stage, p.replica, n)] != devices[k]:
            ready = max(by[tuple(p)].end_ms, previous_end.get(k, float("-inf")))
            waits[k] += max(0.0, a.start_ms - ready)
        previous_end[k] = a.end_ms
    return waits


@dataclass(frozen=True)
class Statistics:
    """What `statistics` finds (`MeasuredTimeline` holds these fields)."""

    measured_bubble_fraction: float | None
    per_stage: list[StageTime]
    slowest_stage: int | None
    step_ms: float | None


def statistics(
    steps: Sequence[MeasuredStep], schedule: Schedule, devices: Sequence[str], replicas: int = 1
) -> Statistics:
    """Per stage (of every copy) means over the complete steps, the measured bubble fraction over every
    device and the slowest stage (of copy 0: every copy runs the same work)."""
    done = [s for s in steps if s.complete]
    n_stages = schedule.stages
    n_rows = n_stages * replicas
    if not done:
        return Statistics(None, [], None, None)
    per = [
        StageTime(i % n_stages, devices[i], 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, replica=i // n_stages) for i in range(n_rows)
    ]
    hosts = sorted(set(devices[:n_rows]))  # interleaved: several stages on one device
    spans, device_busy = 0.0, 0.0
    for s in done:
        acts = s.actions
        spans += max(a.end_ms for a in acts) - min(a.start_ms for a in acts)
        for d in hosts:  # a device is busy while any of its stages is
            device_busy += union(
                (a.start_ms, a.end_ms) for a in acts if devices[row_of(a.stage, a.replica, n_stages)] == d
            )
        for k, wait in enumerate(_waits(acts, schedule, devices, replicas)):
            per[k].copy_wait_ms += wait
        for k in range(n_rows):
            mine = [a for a in acts if row_of(a.stage, a.replica, n_stages) == k]
            per[k].busy_ms += union((a.start_ms, a.end_ms) for a in mine)
            per[k].forward_ms += sum(a.end_ms - a.start_ms for a in mine if a.kind == FORWARD)
            per[k].backward_ms += sum(a.end_ms - a.start_ms for a in mine if a.kind in (BACKWARD, WEIGHT))
            per[k].copy_ms += sum(a.copy_ms for a in mine)
        for u in s.updates:
            per[row_of(u.stage, u.replica, n_stages)].update_ms += u.end_ms - u.start_ms
    n = len(done)
    for p in per:
        p.busy_fraction = p.busy_ms / spans if spans else None
        p.busy_ms, p.forward_ms, p.backward_ms = p.busy_ms / n, p.forward_ms / n, p.backward_ms / n
        p.copy_ms, p.copy_wait_ms, p.update_ms = p.copy_ms / n, p.copy_wait_ms / n, p.update_ms / n
    return Statistics(
        1.0 - device_busy / (len(hosts) * spans) if spans else None,
        per,
        max(range(n_stages), key=lambda k: per[k].busy_ms),
        spans / n,
    )


# --- balance advice ----------------------------------------------------------------------------


def advise(
    busy: Sequence[float],
    layers: Sequence[int],
    threshold: float = SLOW,
    kinds: Sequence[Any] | None = None,
    shares: Sequence[Sequence[float]] | None = None,
) -> Advice | None:
    """When one stage's busy time exceeds the mean by more than `threshold`: the split (layers per
    stage) whose predicted busy times are most even, each layer of stage k costing its share of busy[k]:
    `shares[k]`, one weight per layer (a cut model's parameter counts: its embedding, blocks, an `Add`
    and a read-out are not alike), else busy[k] / layers[k]. None when the stages are even enough (or a
    stage has no layers to count).

    `kinds[k]`: what one layer of stage k is (compared with ==; None: every layer alike). A layer
    moves only between neighbouring stages of one kind, so the advice keeps the network: where
    the kind changes stays a cut (`fixed_cuts`); `constrained` says that a split ignoring kinds
    would have predicted a less busy bottleneck."""
    mean = sum(busy) / len(busy)
    slowest = max(range(len(busy)), key=lambda k: busy[k])
    if mean <= 0 or busy[slowest] <= (1 + threshold) * mean or min(layers) < 1:
        return None
    costs = [cost for k, n in enumerate(layers) for cost in _layer_costs(busy[k], n, shares[k] if shares else None)]
    rows, allowed = [costs] * len(busy), range(1, len(costs))
    fixed = [] if kinds is None else [c for c, a, b in zip(balance.sizes_to_cuts(layers), kinds, kinds[1:]) if a != b]
    now = max(balance.stage_costs(rows, layers))
    split = balance.partition(rows, len(busy), allowed, fixed) or list(layers)
    if max(balance.stage_costs(rows, split)) >= now:  # no better: moving layers would gain nothing
        split = list(layers)
    free = balance.partition(rows, len(busy), allowed) or list(layers)
    predicted = balance.stage_costs(rows, split)
    return Advice(
        slowest,
        busy[slowest],
        mean,
        busy[slowest] / mean - 1,
        list(layers),
        split,
        predicted,
        [b - a for a, b in zip(layers, split)],
        fixed,
        max(balance.stage_costs(rows, free)) < max(predicted),
    )


def _layer_costs(busy: float, n: int, shares: Sequence[float] | None) -> list[float]:
    """A stage's busy time over its `n` layers, by their `shares` (alike when none, or none weigh anything)."""
    if not shares or len(shares) != n or sum(shares) <= 0:
        return [busy / n] * n
    return [busy * w / sum(shares) for w in shares]


def advice_text(advice: Advice, override: str | None) -> str:
    """The advice in one line: which stage, by how much, what to move, and the override that does it."""
    k = advice.stage
    head = (
        f"stage {k} is the bottleneck: busy {advice.busy_ms:.2f} ms per step, "
        f"{100 * advice.excess:.0f}% above the mean ({advice.mean_ms:.2f} ms)"
    )
    if advice.split == advice.layers:
        if advice.constrained:
            return (
                f"{head}; its stages cannot be rebalanced without changing the network (a layer can move only "
                f"between neighbouring stages that differ in nothing but depth; layers per stage "
                f"{advice.layers}): to cut one network at other points, save it as one Keras model and "
                f"run model=keras with placement.split=[...] or placement.balance=time"
            )
        return f"{head}; no cut at layer granularity evens it (a stage holds layers {advice.layers})"
    moved = ", ".join(f"stage {j} {'+' if d > 0 else ''}{d}" for j, d in enumerate(advice.moves) if d)
    worst = max(advice.predicted_ms)
    text = (
        f"{head}; layers per stage {advice.layers} -> {advice.split} ({moved}) predicts the busiest "
        f"stage at {worst:.2f} ms"
    )
    return f"{text}: {override}" if override else text


# --- what a timeline shows (the text grid: `chain.pipeline.measured_grid`) ---------------------


def action(measured: MeasuredAction) -> Action:
    """The schedule's action that `measured` is a run of."""
    return Action(*measured.key())


def shown(measured: MeasuredTimeline) -> MeasuredStep | None:
    """The step a timeline shows: the last complete one (the first may include tracing the step)."""
    done = [s for s in measured.steps if s.complete]
    return done[-1] if done else None
