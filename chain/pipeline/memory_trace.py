"""What is live at a step's memory peak, tensor by tensor, from a profiler trace of the step.

With `TF_CPU_ALLOCATOR_USE_BFC=true` (GPUs always) TensorFlow's profiler records every allocation
and deallocation of the allocator as `MemoryAllocation` / `MemoryDeallocation` events on the
host's plane: the address, the bytes asked for (`requested_bytes`), the bytes of the chunk handed
out (`allocation_bytes`: the BFC allocator rounds up, and hands out a larger free chunk without
splitting it when the remainder would be small), the bytes in use after the event
(`bytes_allocated`, chunk bytes: what the allocator's peak counts), and, on an allocation, the op
that asked (`tf_op`, its full name: its first name scope is the action's, `Action.scope`), its
shape and whether the buffer is the op's output or a temporary (`region_type`).

`read_events` reads them; `live_at_peak` walks them in time order, matching each deallocation to
the allocation at its address, and returns what is live when the bytes in use are highest. What
was allocated before the trace began (the weights, an optimizer's slots) has no allocation event:
the bytes in use at the peak less every traced tensor live then is that baseline (`before`). To
name what earlier steps leave behind, trace several steps and look at the peak of the last one
(`peak_of(logdir, step)`, steps marked as `chain.training.profile` marks them).

`category` names what a live tensor is in the pipeline step (`chain.pipeline.play`), from its op's
name: a forward's activation (`F` scope), a forward run inside a backward (`B` scope, not a
gradient op: a recomputed microbatch's replay, or the last stage's deferred forward), the
gradients at layer outputs and inputs (`gradient_tape/...`, or `W`'s `gradients/...`), weight
gradients (the ops by which TensorFlow's gradient functions make a layer's weights' gradients,
`WEIGHT_GRADIENT_OPS`), temporaries (`region_type` temp), the update, and other (labels, releases,
the report). The gradient sums over microbatches are weight gradients too (`add_grads` sums into
the first microbatch's buffer: TensorFlow forwards an addition's input buffer to its output), so
`breakdown` splits them: per stage and weight, the oldest live gradient is its sum, any later one a
backward's gradient not yet added.

No TensorFlow at import: `read_events` reads the files through `chain.pipeline.timeline.trace_events`.
"""

from __future__ import annotations

import re
from collections import defaultdict
from dataclasses import dataclass
from typing import Iterable, Sequence

from chain.schedule.schedules import BACKWARD, FORWARD, GRADIENT_TAPE, WEIGHT, Action, update_of
from chain.pipeline.timeline import trace_events, trace_files

ALLOCATION = "MemoryAllocation"
DEALLOCATION = "MemoryDeallocation"
# The last name of the ops whose output is a weight's gradient, as TensorFlow's gradient functions
# name them: MatMul's gradient with respect to its second input (a dense kernel) is its second
# MatMul, BiasAdd's is BiasAddGrad, a convolution's filter gradient its BackpropFilter op.
WEIGHT_GRADIENT_OPS = ("MatMul_1", "BiasAddGrad", "Conv2DBackpropFilter", "DepthwiseConv2dNativeBackpropFilter")

BEFORE = "before the step (weights, slots)"
FORWARD_ACTIVATIONS = "activations kept by forwards (F)"
REPLAY_ACTIVATIONS = "activations of forwards inside B (replays)"
GRADIENT_SUMS = "gradient sums"
WEIGHT_GRADIENTS = "a backward's weight gradients, not yet summed"
OUTPUT_GRADIENTS = "gradients at layer outputs and inputs"
TEMPORARIES = "temporaries"
UPDATE = "update"
OTHER = "other (labels, releases, report)"
UNTRACED = "allocated before the trace, freed after the peak"
_ACTION_SCOPE = re.compile(r"(^|/)(r\d+_)?s\d+_[FBW]\d+(?=/)")  # an action's scope within a name (`Action.scope`)
CATEGORIES = (
    BEFORE,
    UNTRACED,
    FORWARD_ACTIVATIONS,
    REPLAY_ACTIVATIONS,
    GRADIENT_SUMS,
    WEIGHT_GRADIENTS,
    OUTPUT_GRADIENTS,
    TEMPORARIES,
    UPDATE,
    OTHER,
)


@dataclass(frozen=True)
class MemoryEvent:
    """One allocator event: `allocated` True for an allocation, False for a deallocation; `time_ps`
    (picoseconds from the trace's start), the buffer's `addr`, `requested` and `chunk` bytes, `in_use`
    (the allocator's bytes in use after the event, chunk bytes), and on an allocation the op that
    asked (`op`, its full name), its `shape` and `region` ("output" or "temp")."""

    allocated: bool
    time_ps: int
    addr: int
    requested: int
    chunk: int
    in_use: int
    op: str = ""
    shape: str = ""
    region: str = ""


@dataclass(frozen=True)
class LiveTensor:
    """A buffer live at the peak: its allocation event (None if allocated before the trace, then
    `requested` and `chunk` come from its deallocation) and its `category`."""

    event: MemoryEvent | None
    requested: int
    chunk: int
    category: str


@dataclass
class Peak:
    """The live set at the step's peak: `in_use` (the allocator's bytes in use then, chunk bytes),
    the traced buffers live then, and `before`, the chunk bytes of what was allocated before the
    trace began and is neither freed in it (the weights, slots)."""

    in_use: int
    time_ps: int
    live: list[LiveTensor]
    before: int

    def breakdown(self) -> dict[str, tuple[int, int]]:
        """Per category (`CATEGORIES` order), (requested bytes, chunk bytes) of what is live at the
        peak; `BEFORE` is chunk bytes both times (its requests are not traced)."""
        out: dict[str, list[int]] = {c: [0, 0] for c in CATEGORIES}
        out[BEFORE] = [self.before, self.before]
        for t in self.live:
            out[t.category][0] += t.requested
            out[t.category][1] += t.chunk
        return {c: (r, b) for c, (r, b) in out.items()}

    def by_op(self, category: str) -> dict[str, tuple[int, int]]:
        """(requested, chunk) bytes per op name of the live buffers of one category, largest first."""
        out: dict[str, list[int]] = defaultdict(lambda: [0, 0])
        for t in self.live:
            if t.category == category:
                name = t.event.op if t.event is not None else "?"
                out[name][0] += t.requested
                out[name][1] += t.chunk
        return dict(sorted(((k, (r, b)) for k, (r, b) in out.items()), key=lambda kv: -kv[1][0]))


def read_events(paths: Iterable[str]) -> tuple[list[MemoryEvent], dict[int, tuple[int, int]]]:
    """Every allocator event in the trace files `paths` (`trace_files(logdir)`), in time order, and
    each marked step's (start, end) in the events' time (`MARKER` with its `step_num`, as
    `chain.training.profile` marks a step)."""
    events, steps = [], {}
    for t in trace_events(paths):
        number = t.step_number()
        if number is not None:
            steps[number] = (t.start_ps, t.start_ps + t.event.duration_ps)
        if t.name not in (ALLOCATION, DEALLOCATION):
            continue
        stats = t.stats()
        events.append(
            MemoryEvent(
                allocated=t.name == ALLOCATION,
                time_ps=t.start_ps,
                addr=int(stats.get("addr") or 0),
                requested=int(stats.get("requested_bytes") or 0),
                chunk=int(stats.get("allocation_bytes") or 0),
                in_use=int(stats.get("bytes_allocated") or 0),
                op=str(stats.get("tf_op") or ""),
                shape=str(stats.get("shape") or ""),
                region=str(stats.get("region_type") or ""),
            )
        )
    events.sort(key=lambda e: e.time_ps)
    return events, steps


def category(event: MemoryEvent) -> str:
    """What a traced buffer is in the pipeline step, from its op's name (see the module's docstring);
    weight gradients are all `GRADIENT_SUMS` here (`Peak.breakdown` is told which are not yet summed
    by `split_sums`)."""
    if event.region == "temp":
        return TEMPORARIES
    name = event.op
    action = Action.parse(name)
    if action is None:
        return UPDATE if update_of(name) is not None else OTHER
    gradient = name.startswith(GRADIENT_TAPE) or f"{action.scope()}/gradients/" in name
    if gradient or action.kind == WEIGHT:
        return GRADIENT_SUMS if name.rsplit("/", 1)[-1] in WEIGHT_GRADIENT_OPS else OUTPUT_GRADIENTS
    return FORWARD_ACTIVATIONS if action.kind == FORWARD else REPLAY_ACTIVATIONS if action.kind == BACKWARD else OTHER


def _weight_key(op: str) -> tuple[int, str]:
    """(stage, the op's name without its action's scope): the same weight's gradient in every microbatch's
    backward (Keras numbers a layer's calls, `dense_3_1`, the same in every microbatch's trace)."""
    action = Action.parse(op)
    rest = op[len(GRADIENT_TAPE) :] if op.startswith(GRADIENT_TAPE) else op
    return (action.stage if action else -1), _ACTION_SCOPE.sub("", rest)


def split_sums(live: Sequence[LiveTensor]) -> list[LiveTensor]:
    """The live weight gradients told apart: per stage and weight, the oldest is the gradient sum
    (the first microbatch's gradient, which every addition then overwrites in place), any later one
    a backward's weight gradient not yet added to it."""
    oldest: dict[tuple[int, str], int] = {}
    for t in live:
        if t.category == GRADIENT_SUMS and t.event is not None:
            key = _weight_key(t.event.op)
            oldest[key] = min(oldest.get(key, t.event.time_ps), t.event.time_ps)
    return [
        LiveTensor(t.event, t.requested, t.chunk, WEIGHT_GRADIENTS)
        if t.category == GRADIENT_SUMS and t.event is not None and t.event.time_ps != oldest[_weight_key(t.event.op)]
        else t
        for t in live
    ]


def live_at_peak(events: Sequence[MemoryEvent], within: tuple[int, int] | None = None) -> Peak:
    """The buffers live when the allocator's bytes in use are highest among `events` (time order),
    or among those `within` (start, end) (one step of several traced: what earlier steps left is
    then traced too): allocations not yet matched by a deallocation at their address, each with its
    `category`, and those allocated before the trace and freed after the peak (`UNTRACED`)."""
    candidates = [i for i, e in enumerate(events) if within is None or within[0] <= e.time_ps <= within[1]]
    if not candidates:
        raise ValueError("no allocator events in the trace (is TF_CPU_ALLOCATOR_USE_BFC=true set on CPU?)")
    top = max(candidates, key=lambda i: events[i].in_use)
    live: dict[int, MemoryEvent] = {}
    for e in events[: top + 1]:
        if e.allocated:
            live[e.addr] = e
        else:
            live.pop(e.addr, None)
    seen = set()  # allocated before the peak, or freed before it: not an untraced buffer live at the peak
    for e in events[: top + 1]:
        seen.add(e.addr)
    untraced = {}
    for e in events[top + 1 :]:
        if not e.allocated and e.addr not in seen and e.addr not in untraced:
            untraced[e.addr] = e
        seen.add(e.addr)
    tensors = [LiveTensor(e, e.requested, e.chunk, category(e)) for e in live.values()]
    tensors += [LiveTensor(None, e.requested, e.chunk, UNTRACED) for e in untraced.values()]
    tensors = split_sums(tensors)
    before = events[top].in_use - sum(t.chunk for t in tensors)
    return Peak(in_use=events[top].in_use, time_ps=events[top].time_ps, live=tensors, before=before)


def peak_of(logdir: str, step: int | None = None) -> Peak:
    """`live_at_peak` of the trace written under `logdir` (`tf.profiler.experimental.start(logdir)`):
    at the peak of marked step `step` (`MARKER`), or of the whole trace."""
    events, steps = read_events(trace_files(logdir))
    if step is not None and step not in steps:
        raise ValueError(f"step {step} is not marked in the trace under {logdir} (marked: {sorted(steps)})")
    return live_at_peak(events, steps[step] if step is not None else None)


def table(peak: Peak, mib: float = 2.0**20) -> list[str]:
    """The breakdown as Markdown table rows (MiB): category, requested, chunk (allocated)."""
    rows = ["| live at the peak | requested, MiB | allocated (chunks), MiB |", "|---|---|---|"]
    total_r = total_b = 0
    for name, (r, b) in peak.breakdown().items():
        if b:
            rows.append(f"| {name} | {r / mib:.2f} | {b / mib:.2f} |")
            total_r, total_b = total_r + r, total_b + b
    rows.append(f"| **all** | {total_r / mib:.2f} | {total_b / mib:.2f} |")
    return rows
