"""Pipeline schedules as data: which stage does which microbatch's forward or backward, in what order.

A schedule lists, for every stage, the ordered actions `(stage, microbatch, "F"|"B"|"W")`
that stage performs in one training step. A schedule without "W" actions runs each backward
whole ("B": the gradients of the stage's input and of its weights); a *split* schedule (zero
bubble, `zb1` and `zbv`) runs "B" for the input's gradient only (what the previous stage waits for) and
"W" for the weights' gradients later, where the stage would otherwise idle. Builders here are pure functions, so their
properties (every forward precedes its backward, 1F1B's bound on live activations, the
bubble) are checked without TensorFlow; `chain.pipeline.play` executes a schedule inside
one `tf.function`, chaining each stage's actions in this order.

Each schedule is a row of `BUILDERS` (`Builder`): its builder and what it is (how it places its
stages, whether it splits the backward, ...), which every other module reads instead of its name.

`play_timed` is the one timed player: a schedule's actions played with a cost each (each action
starts once its row's previous action and its inputs have ended). `simulate` is it on an idealised
machine (every action takes one time slot) and gives the per-device timeline and the bubble
fraction that `plan_only=true` prints and summary.json records; `chain.pipeline.idle` plays it with
measured durations and `chain.autoplan.search` with the planner's predicted costs.

The names the step gives its ops are defined here too (`Action.scope`, `update_scope`), with
their readers (`Action.parse`, `update_stage`) that `chain.pipeline.timeline` reads a trace with.

This module imports no TensorFlow.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Callable, Hashable, Mapping, NamedTuple, Sequence

FORWARD = "F"
BACKWARD = "B"
WEIGHT = "W"  # a split schedule's weight-gradient half of a backward
KINDS = (FORWARD, BACKWARD, WEIGHT)
UPDATE = "update"  # after its last backward, each stage applies its gradients (not an action of the schedule)
GRADIENT_TAPE = "gradient_tape/"  # the prefix `tf.GradientTape` gives the gradient ops of a scope's ops
IDLE, RUNNING = ".", "-"  # a grid's empty cell: its row idles; its row still runs an action to its left (measured)
DONE = "done"  # the no-op that ends each action in the step: it waits on the action's ops, it is not their work


class Action(NamedTuple):
    """One unit of pipeline work: stage `stage` runs `kind` ("F", "B" or "W") on microbatch `microbatch`,
    in copy `replica` of the pipeline (`placement.replicas`; 0 without copies: a schedule's actions).

    Its ops carry its name scope (`scope()`, e.g. `s1_F0`, or `r1_s1_F0` in copy 1), and `Action.parse`
    reads the action back from an op's name: the one vocabulary the step names its ops in and a trace
    is read in (as torch.distributed.pipelining's `_Action` prints and parses one format).
    """

    stage: int
    microbatch: int
    kind: str
    replica: int = 0

    def __str__(self) -> str:
        return f"{self.kind}{self.microbatch}"

    def scope(self) -> str:
        """The name scope of this action's ops in the step, e.g. `s1_F0` (stage 1, forward, microbatch 0);
        copy r > 0 of the pipeline prefixes `r{r}_` (`r1_s1_F0`)."""
        return replica_prefix(self.replica) + f"s{self.stage}_{self.kind}{self.microbatch}"

    @classmethod
    def parse(cls, op_name: str) -> Action | None:
        """The action an op belongs to, from its name (`scope()` as the first name scope), or None.

        The tape's gradient ops of F(k, m) (`gradient_tape/s{k}_F{m}/...`) run in B(k, m)."""
        gradient = op_name.startswith(GRADIENT_TAPE)
        replica, name = split_replica(op_name[len(GRADIENT_TAPE) :] if gradient else op_name)
        parsed = _stage_scope(name)
        if parsed is None or parsed[1][:1] not in KINDS or not _is_number(parsed[1][1:]):
            return None
        stage, rest = parsed
        return cls(stage, int(rest[1:]), BACKWARD if gradient else rest[0], replica)


def replica_prefix(replica: int) -> str:
    """What copy `replica` of the pipeline puts before its scopes' names: `r{r}_`, nothing for copy 0."""
    return f"r{replica}_" if replica else ""


def split_replica(op_name: str) -> tuple[int, str]:
    """An op name's copy of the pipeline (its `replica_prefix`; 0 without one) and the name without it."""
    head, underscore, rest = op_name.partition("_")
    if head.startswith("r") and underscore and _is_number(head[1:]) and int(head[1:]) > 0:
        return int(head[1:]), rest
    return 0, op_name


def update_scope(stage: int, replica: int = 0) -> str:
    """The name scope of stage `stage`'s optimizer update in the step, e.g. `s1_update` (`r1_s1_update`
    in copy 1 of the pipeline)."""
    return replica_prefix(replica) + f"s{stage}_{UPDATE}"


def update_stage(op_name: str) -> int | None:
    """The stage whose update an op belongs to (its first name scope is `update_scope(k, r)`), or None."""
    found = update_of(op_name)
    return found[1] if found is not None else None


def update_of(op_name: str) -> tuple[int, int] | None:
    """(copy, stage) of the update an op belongs to (its first name scope is `update_scope(k, r)`), or None."""
    replica, name = split_replica(op_name)
    parsed = _stage_scope(name)
    return (replica, parsed[0]) if parsed is not None and parsed[1] == UPDATE else None


def _is_number(text: str) -> bool:
    return text.isdecimal() and text.isascii()


def _stage_scope(op_name: str) -> tuple[int, str] | None:
    """An op name's first name scope `s{k}_{rest}` as (k, rest), or None if it is not a stage's."""
    first = op_name.split("/", 1)[0]
    stage, underscore, rest = first[1:].partition("_")
    if not first.startswith("s") or not underscore or not _is_number(stage):
        return None
    return int(stage), rest


@dataclass(frozen=True)
class Schedule:
    """A named schedule for `stages` stages and `microbatches` microbatches.

    `actions[r]` is device r's ordered list of actions: the order the engine enforces. Stage k
    runs on device `row(k)`: device k itself unless `stage_rows` (stage -> device row) says otherwise,
    as interleaved and zbv stages do (several stages on one device; the planner follows this map).
    """

    name: str
    stages: int
    microbatches: int
    actions: tuple[tuple[Action, ...], ...]
    stage_rows: tuple[int, ...] = ()  # stage k -> its device's row; () is stage k on device k

    @property
    def devices(self) -> int:
        """How many devices (rows) the schedule runs on."""
        return max(self.stage_rows) + 1 if self.stage_rows else self.stages

    def row(self, stage: int) -> int:
        """The device (row of `actions`) that runs `stage`."""
        return self.stage_rows[stage] if self.stage_rows else stage

    def row_stages(self, row: int) -> list[int]:
        """The stages device `row` runs."""
        return [k for k in range(self.stages) if self.row(k) == row]


@dataclass(frozen=True)
class Timeline:
    """A schedule played on unit-time actions: `grid[k][t]` is stage k's action in slot t (None: idle)."""

    grid: tuple[tuple[Action | None, ...], ...]

    @property
    def slots(self) -> int:
        return len(self.grid[0]) if self.grid else 0

    @property
    def bubble_fraction(self) -> float:
        """Idle slots over all slots (stages x time): 0 for a perfect pipeline."""
        total = len(self.grid) * self.slots
        idle = sum(a is None for row in self.grid for a in row)
        return idle / total if total else 0.0

    def order(self) -> list[Action]:
        """Every action by start slot, then stage: an order that respects all dependencies."""
        return [a for t in range(self.slots) for row in self.grid if (a := row[t]) is not None]


def _check(stages: int, microbatches: int) -> None:
    if stages < 1 or microbatches < 1:
        raise ValueError(f"a schedule needs stages >= 1 and microbatches >= 1, got {stages} and {microbatches}")


def sequential(stages: int, microbatches: int) -> Schedule:
    """No overlap: one microbatch at a time goes through every stage and back before the next starts.

    With one microbatch this is full-batch training split across devices (the
    reference); with M it is gradient accumulation over M microbatches.
    """
    _check(stages, microbatches)
    rows = tuple(
        tuple(a for m in range(microbatches) for a in (Action(k, m, FORWARD), Action(k, m, BACKWARD)))
        for k in range(stages)
    )
    return Schedule("sequential", stages, microbatches, rows)


def gpipe(stages: int, microbatches: int) -> Schedule:
    """GPipe: every stage runs all M forwards, then all M backwards (M activations live per stage)."""
    _check(stages, microbatches)
    rows = tuple(
        tuple(Action(k, m, FORWARD) for m in range(microbatches))
        + tuple(Action(k, m, BACKWARD) for m in range(microbatches))
        for k in range(stages)
    )
    return Schedule("gpipe", stages, microbatches, rows)


def one_f_one_b(stages: int, microbatches: int) -> Schedule:
    """Non-interleaved 1F1B (PipeDream-flush, Megatron-LM).

    Stage k first runs K-k-1 warm-up forwards, then alternates one forward and one
    backward, then drains the remaining backwards. At most K-k microbatches (so at most
    K) have activations alive on stage k, against M for GPipe.
    """
    return Schedule("1f1b", stages, microbatches, _ahead_rows(stages, microbatches, lambda k: stages - k))


def _ahead_rows(stages: int, microbatches: int, ahead: Callable[[int], int]) -> tuple[tuple[Action, ...], ...]:
    """Each stage k's row of a 1F1B order: min(M, `ahead(k)`) forwards before its first backward, then one
    backward and one forward, then the rest of the backwards."""
    _check(stages, microbatches)
    rows = []
    for k in range(stages):
        first = min(ahead(k), microbatches)
        row = [Action(k, m, FORWARD) for m in range(first)]
        for i in range(microbatches - first):  # steady state: B(i), then F(first + i)
            row += [Action(k, i, BACKWARD), Action(k, first + i, FORWARD)]
        row += [Action(k, m, BACKWARD) for m in range(microbatches - first, microbatches)]
        rows.append(tuple(row))
    return tuple(rows)


def eager_one_f_one_b(stages: int, microbatches: int) -> Schedule:
    """Eager 1F1B (PaddlePaddle's and JaxPP's `Eager1F1B`): 1F1B with K-k-1 more warm-up forwards on stage k,
    2 (K-k) - 1 forwards before its first backward, then one backward and one forward, then the rest of the
    backwards.

    In 1F1B stage k runs its forward of microbatch m+K-k only after its backward of m, which waits for
    stage k+1's: the next stage's next input is ready only if the time of one hop there and back fits in the
    slack between the two stages. Here each forward runs K-k-1 backwards earlier, so in the steady state a stage
    feeding a slower one (or across a slow link) does not keep it waiting. The same bubble as 1F1B with unit-time
    actions, for more memory: stage k holds min(M, 2 (K-k) - 1) microbatches' activations, against 1F1B's K-k.
    """
    return Schedule(
        "eager1f1b", stages, microbatches, _ahead_rows(stages, microbatches, lambda k: 2 * (stages - k) - 1)
    )


def zero_bubble_h1(stages: int, microbatches: int) -> Schedule:
    """Zero bubble ZB-H1 (Qi et al., 2023): 1F1B's order of forwards and input-gradient backwards
    ("B"), each stage's weight gradients ("W") moved into the slots where 1F1B idles.

    Built by playing the stages on unit-time actions: in each slot a stage runs its next F or B
    (in 1F1B's order) if its inputs are there; else, or when one more forward would hold more
    than `stages` microbatches' activations (1F1B's peak, on its first stage), the oldest W
    whose B has run. W keeps the activations a forward saved, so a stage holds at most
    `stages` microbatches between F and W: the same peak as 1F1B. With F, B and W of one slot
    each, every stage idles `stages - 1` slots, against 1F1B's `3 (stages - 1)` with a whole
    backward of two: a third of the bubble.
    """
    _check(stages, microbatches)
    queues = [[a for a in row] for row in one_f_one_b(stages, microbatches).actions]
    rows: list[list[Action]] = [[] for _ in range(stages)]
    done: set[Action] = set()
    pending: list[list[Action]] = [[] for _ in range(stages)]  # W's whose B has run, oldest first
    live = [0] * stages
    while any(queues) or any(pending):
        started = []
        for k in range(stages):
            head = queues[k][0] if queues[k] else None
            ready = head is not None and all(d in done for d in dependencies(head, stages, split=True))
            if ready and head.kind == FORWARD and live[k] >= stages:
                ready = False  # memory: retire a W first
            if ready:
                queues[k].pop(0)
                action = head
                if head.kind == FORWARD:
                    live[k] += 1
                else:
                    pending[k].append(Action(k, head.microbatch, WEIGHT))
            elif pending[k]:
                action = pending[k].pop(0)
                live[k] -= 1
            else:
                continue
            rows[k].append(action)
            started.append(action)
        done.update(started)
    return Schedule("zb1", stages, microbatches, tuple(tuple(r) for r in rows))


def interleaved(stages: int, microbatches: int, devices: int | None = None) -> Schedule:
    """Interleaved 1F1B (Megatron-LM's virtual pipeline stages, torch's Interleaved1F1B): `stages`
    stages on `devices` devices, stage k on device k mod D (rows "loop"), so each device
    holds V = stages / D of them and a microbatch passes every device V times.

    Each device runs its (stage, microbatch) forwards in groups of D microbatches per stage, its
    own stages in turn (stage order for forwards, reversed for backwards), after Megatron's
    warm-up of 2 (D - d - 1) + (V - 1) D forwards on device d, then one forward / one backward,
    then the remaining backwards. M must be a multiple of D. With unit-time actions the bubble
    is (D - 1) / (V M + D - 1): V times smaller than 1F1B's on the same devices.
    Without `devices` (or with D = stages) it is 1F1B.
    """
    _check(stages, microbatches)
    d_count = devices or stages
    if d_count < 1 or stages % d_count:
        raise ValueError(f"interleaved stages need a device count that divides the {stages} stages, got {d_count}")
    if microbatches % d_count:
        raise ValueError(f"interleaved: {microbatches} microbatches are not a multiple of the {d_count} devices")
    v = stages // d_count
    total = microbatches * v

    def forward(d: int, i: int) -> Action:
        chunk = (i // d_count) % v
        return Action(chunk * d_count + d, (i // (d_count * v)) * d_count + i % d_count, FORWARD)

    def backward(d: int, i: int) -> Action:
        chunk = v - 1 - (i // d_count) % v
        return Action(chunk * d_count + d, (i // (d_count * v)) * d_count + i % d_count, BACKWARD)

    rows = []
    for d in range(d_count):
        warmup = total if microbatches == d_count else min((d_count - d - 1) * 2 + (v - 1) * d_count, total)
        row = [forward(d, i) for i in range(warmup)]
        for i in range(total - warmup):
            row += [forward(d, warmup + i), backward(d, i)]
        row += [backward(d, i) for i in range(total - warmup, total)]
        rows.append(tuple(row))
    stage_rows = tuple(k % d_count for k in range(stages)) if d_count < stages else ()
    return Schedule("interleaved", stages, microbatches, tuple(rows), stage_rows)


def v_rows(stages: int) -> tuple[int, ...]:
    """The V rows of `stages` = 2D stages on D devices: stage k and stage 2D-1-k on device k, so a
    microbatch goes down the devices and back up, and the first and last stages share device 0."""
    return tuple(min(k, stages - 1 - k) for k in range(stages))


def zero_bubble_v(stages: int, microbatches: int) -> Schedule:
    """ZB-V (Qi et al., 2024, section 6; torch.distributed.pipelining's `ScheduleZBVZeroBubble`):
    2D stages on D devices in a V (`v_rows`), each backward split into B and W as zb1's.

    Device d holds its "down" stage d and its "up" stage 2D-1-d, and plays, as torch builds it for
    max(M, 2D-1) microbatches (the actions of microbatches past M then left out):
    2(D-d)-1 forwards of the down stage; d pairs (up forward, down forward); D-d triples (up F, B,
    W); then, while forwards remain, (down F, down B, down W, up F, up B, up W); then d pairs
    (down B, up B), D-d pairs (down B, its oldest W), and the W's still owed, the up stage's first.
    The first and last stages share device 0, so its warm-up (the first stage's forwards) and its
    cool-down (the last stage's backwards) overlap. With F, B and W of one slot each every device
    idles D-1 slots for M >= 2D: a bubble of (D-1)/(6M+D-1), half of zb1's on the same devices
    (whose actions, over a stage twice the size, take two slots each). Stage k holds at most 2D-k
    microbatches' activations, and a device at most 2D of its half-size stages' at once: 1F1B's
    peak on its first device (D microbatches of a whole stage), here on every device.
    """
    _check(stages, microbatches)
    if stages % 2:
        raise ValueError(
            f"zbv runs two stages on each device (stage k and 2D-1-k on device k): {stages} stages "
            "is not an even number"
        )
    d_count = stages // 2
    played = max(microbatches, 2 * d_count - 1)  # enough microbatches to fill the V; the extra ones dropped below
    rows = []
    for d in range(d_count):
        down, up = d, stages - 1 - d
        row: list[Action] = []
        count = {(k, kind): 0 for k in (down, up) for kind in KINDS}

        def add(k: int, *kinds: str, row: list[Action] = row, count: dict = count) -> None:
            for kind in kinds:
                row.append(Action(k, count[(k, kind)], kind))
                count[(k, kind)] += 1

        for _ in range(2 * (d_count - d) - 1):
            add(down, FORWARD)
        for _ in range(d):
            add(up, FORWARD)
            add(down, FORWARD)
        for _ in range(d_count - d):
            add(up, FORWARD, BACKWARD, WEIGHT)
        while count[(up, FORWARD)] < count[(down, FORWARD)] or count[(down, FORWARD)] < played:
            if count[(down, FORWARD)] < played:
                add(down, FORWARD)
            add(down, BACKWARD, WEIGHT)
            add(up, FORWARD, BACKWARD, WEIGHT)
        for _ in range(d):
            add(down, BACKWARD)
            add(up, BACKWARD)
        for _ in range(d_count - d):
            add(down, BACKWARD, WEIGHT)
        for k in (up, down):
            while count[(k, WEIGHT)] < count[(k, BACKWARD)]:
                add(k, WEIGHT)
        rows.append(tuple(a for a in row if a.microbatch < microbatches))
    return Schedule("zbv", stages, microbatches, tuple(rows), v_rows(stages))


class Rows(Enum):
    """How a schedule puts its stages on devices (what `Schedule.stage_rows` holds once it is built)."""

    OWN = "own"  # stage k on device k
    LOOP = "loop"  # stage k on device k mod D, D = stages / pipeline.virtual_stages (a builder taking `devices`)
    V = "v"  # stage k and stage 2D-1-k on device k: two stages on each device (`v_rows`)


@dataclass(frozen=True)
class Builder:
    """A schedule's row of `BUILDERS`: its builder and what it is, which the config checks, plan=auto,
    the report and the memory estimate read instead of its name. `build(stages, microbatches)`, or
    `build(stages, microbatches, devices)` for `Rows.LOOP`; `split`: it runs each backward as B and W
    apart (W needs what the forward kept, so no `pipeline.recompute`); `microbatches_of_devices`: the
    microbatches must be a multiple of its devices; `searched`: `placement.plan=auto` tries it."""

    build: Callable[..., Schedule]
    rows: Rows = Rows.OWN
    split: bool = False
    microbatches_of_devices: bool = False
    searched: bool = True

    @property
    def per_device(self) -> int | None:
        """Stages on each device: 1, 2 (a V), or None: `pipeline.virtual_stages` says (looped)."""
        return {Rows.OWN: 1, Rows.V: 2, Rows.LOOP: None}[self.rows]


BUILDERS = {
    "sequential": Builder(sequential, searched=False),  # one microbatch at a time never wins a search
    "gpipe": Builder(gpipe),
    "1f1b": Builder(one_f_one_b),
    # not searched yet: plan=auto's memory estimate and predicted steps have not been held to its measured ones
    "eager1f1b": Builder(eager_one_f_one_b, searched=False),
    "zb1": Builder(zero_bubble_h1, split=True),
    "interleaved": Builder(interleaved, Rows.LOOP, microbatches_of_devices=True),
    "zbv": Builder(zero_bubble_v, Rows.V, split=True),
}
NAMES = tuple(BUILDERS)  # the built-in schedules' names (a row added to BUILDERS later is read from BUILDERS)
FILE = (
    "file"  # pipeline.schedule=file: the schedule is read from pipeline.schedule_file (`chain.schedule.schedule_file`)
)
CHOICES = NAMES + (FILE,)  # the built-in schedules and `file` (the config schema reads BUILDERS when it checks)


def build(name: str, stages: int, microbatches: int, devices: int | None = None) -> Schedule:
    """The schedule called `name` (a row of `BUILDERS`); `devices`: how many devices a looped schedule's
    stages share (stage k on device k mod devices; the others place their stages themselves and
    ignore it: zbv always puts two stages on each device, `v_rows`)."""
    row = BUILDERS.get(name)
    if row is None:
        raise ValueError(f"schedule {name!r} is not known; allowed: {', '.join(BUILDERS)}")
    if row.rows is Rows.LOOP:
        return row.build(stages, microbatches, devices)
    return row.build(stages, microbatches)


def where(rows: Rows) -> tuple[str, ...]:
    """The schedules of `BUILDERS` that place their stages as `rows` says (for messages)."""
    return tuple(name for name, row in BUILDERS.items() if row.rows is rows)


def searched() -> tuple[str, ...]:
    """The schedules `placement.plan=auto` tries, in `BUILDERS`' order."""
    return tuple(name for name, row in BUILDERS.items() if row.searched)


def rows_rule(schedule: Schedule) -> str:
    """Where `schedule` puts its stages, in words for notes and messages: `stage k on device k mod 2`
    (interleaved), `stage k and stage 3-k on device k` (zbv), or each stage's device (a file's rows)."""
    d, k_count = schedule.devices, schedule.stages
    if not schedule.stage_rows:
        return "stage k on device k"
    if schedule.stage_rows == tuple(k % d for k in range(k_count)):
        return f"stage k on device k mod {d}"
    if schedule.stage_rows == v_rows(k_count):
        return f"stage k and stage {k_count - 1}-k on device k"
    return ", ".join(f"stage {k} on device {r}" for k, r in enumerate(schedule.stage_rows))


def is_split(schedule: Schedule) -> bool:
    """Whether `schedule` splits its backwards into B (input gradient) and W (weight gradients)."""
    return any(a.kind == WEIGHT for row in schedule.actions for a in row)


def dependencies(action: Action, stages: int, split: bool = False) -> list[Action]:
    """The actions of other stages (or the same microbatch's forward) that `action` needs.

    F(k,m) needs F(k-1,m)'s output; B(k,m) needs B(k+1,m)'s input gradient and
    F(k,m)'s saved activations (the last stage's backward starts from its own loss);
    W(k,m) needs B(k,m) (`split`: the schedule has W actions; it changes nothing else).
    """
    k, m, kind, r = action
    if kind == FORWARD:
        return [Action(k - 1, m, FORWARD, r)] if k > 0 else []
    if kind == WEIGHT:
        return [Action(k, m, BACKWARD, r)]
    deps = [Action(k, m, FORWARD, r)]
    if k < stages - 1:
        deps.append(Action(k + 1, m, BACKWARD, r))
    return deps


def rounds(order: Sequence[Action], microbatches: int, grad_accum: int, replica: int = 0) -> list[Action]:
    """`order` played `grad_accum` times, round r on microbatches r*M .. r*M+M-1, by copy `replica`:
    the actions a step runs (`chain.pipeline.play`), a trace is read against (`timeline`) and a
    replay plays (`idle`)."""
    return [Action(a.stage, r * microbatches + a.microbatch, a.kind, replica) for r in range(grad_accum) for a in order]


def validate(schedule: Schedule) -> None:
    """Raise ValueError unless every stage runs each microbatch's F and B (and, in a split schedule,
    W) exactly once on its device, each after what it needs of its own device (B after F, W after B)."""
    if len(schedule.actions) != schedule.devices:
        raise ValueError(f"{schedule.name}: {len(schedule.actions)} rows for {schedule.devices} devices")
    kinds = KINDS if is_split(schedule) else (FORWARD, BACKWARD)
    for r, row in enumerate(schedule.actions):
        mine = schedule.row_stages(r)
        want = {Action(k, m, kind) for k in mine for m in range(schedule.microbatches) for kind in kinds}
        if len(row) != len(want) or set(row) != want:
            raise ValueError(
                f"{schedule.name}: {_name(schedule, r)} must run {' and '.join(kinds)} of each of "
                f"{schedule.microbatches} microbatches once"
            )
        position = {a: i for i, a in enumerate(row)}
        for a in row:
            for d in dependencies(a, schedule.stages):
                if schedule.row(d.stage) == r and position[d] > position[a]:
                    raise ValueError(
                        f"{schedule.name}: {_name(schedule, r)} runs {_cell(schedule, a)} before {_cell(schedule, d)}"
                    )


def _name(schedule: Schedule, row: int) -> str:
    """How messages name a row: `stage k` when each stage has its device, else `device r`."""
    return f"device {row}" if schedule.stage_rows else f"stage {row}"


def _cell(schedule: Schedule, action: Action) -> str:
    """An action as a grid shows it: `F3`, or `F3@s2` when devices hold several stages."""
    return f"{action}@s{action.stage}" if schedule.stage_rows else str(action)


@dataclass(frozen=True)
class Timed:
    """A schedule played with a cost per action (`play_timed`): `rows[r]`, row r's actions in the order
    it ran them; `start[a]`/`end[a]`, when action `a` ran; `busy[r]`, the sum of row r's actions' costs.
    The step starts at 0."""

    rows: tuple[tuple[Action, ...], ...]
    start: Mapping[Action, float]
    end: Mapping[Action, float]
    busy: tuple[float, ...]

    @property
    def row_ends(self) -> tuple[float, ...]:
        """When each row's last action ends (0 for a row without actions)."""
        return tuple(self.end[row[-1]] if row else 0 for row in self.rows)

    @property
    def span(self) -> float:
        """The step's span: its first action's start (0) to its last action's end."""
        return max(self.row_ends, default=0)

    @property
    def idle(self) -> tuple[float, ...]:
        """Each row's time within the span without an action of its own."""
        return tuple(self.span - b for b in self.busy)

    @property
    def bubble_fraction(self) -> float:
        """Idle time over all rows' time within the span: 0 for a perfect pipeline."""
        span = self.span
        return (1 - sum(self.busy) / (len(self.rows) * span)) if span else 0.0


class Deadlock(ValueError):
    """A schedule that `play_timed` cannot finish: `at`, when the last action that could run ended;
    `next[r]`, the position in row r of its first action that can never run."""

    def __init__(self, schedule: Schedule, at: float, nxt: Sequence[int]) -> None:
        super().__init__(f"{schedule.name}: deadlock at {at}")
        self.at, self.next = at, tuple(nxt)


def play_timed(
    schedule: Schedule,
    cost: Callable[[Action], float],
    *,
    grad_accum: int = 1,
    copies: int = 1,
    wait: Callable[[Action, Action], float] | None = None,
    shared: Sequence[Hashable] | None = None,
) -> Timed:
    """The one timed player: `schedule`'s rows (each `grad_accum` rounds, `rounds`; `copies` copies of the
    pipeline, copy after copy) played with `cost(action)` per action. An action starts when its row's
    previous action and everything it needs (`dependencies`) have ended, plus `wait(needed, action)`
    after each of those (a transfer); rows with the same `shared[r]` (a physical device) run one action
    at a time. Of the actions that may start, the earliest starts first (ties: the lower row). Unit
    costs give `simulate`'s slots, measured durations `chain.pipeline.idle`'s replay, the planner's
    costs `chain.autoplan.search`'s. Raises `Deadlock` if some action can never run."""
    split = is_split(schedule)
    m = schedule.microbatches
    rows = tuple(tuple(rounds(row, m, grad_accum, c)) for c in range(copies) for row in schedule.actions)
    owner = list(shared) if shared is not None else list(range(len(rows)))
    start: dict[Action, float] = {}
    end: dict[Action, float] = {}
    free = [0] * len(rows)
    owner_free = dict.fromkeys(owner, 0)
    busy = [0] * len(rows)
    nxt = [0] * len(rows)
    for _ in range(sum(len(r) for r in rows)):
        best, best_start = -1, 0
        for i, row in enumerate(rows):
            if nxt[i] == len(row):
                continue
            action = row[nxt[i]]
            deps = dependencies(action, schedule.stages, split)
            if any(d not in end for d in deps):
                continue
            after = [end[d] + wait(d, action) for d in deps] if wait is not None else [end[d] for d in deps]
            ready = max([free[i], owner_free[owner[i]]] + after)
            if best < 0 or ready < best_start:
                best, best_start = i, ready
        if best < 0:
            raise Deadlock(schedule, max(end.values(), default=0), nxt)
        action = rows[best][nxt[best]]
        took = cost(action)
        start[action], end[action] = best_start, best_start + took
        free[best] = owner_free[owner[best]] = end[action]
        busy[best] += took
        nxt[best] += 1
    return Timed(rows, start, end, tuple(busy))


def simulate(schedule: Schedule) -> Timeline:
    """Play `schedule` with unit-time actions (`play_timed`); each stage starts its next action as soon as it may.

    An action may start in slot t when the stage's previous action has finished and
    every dependency finished in a slot before t. Raises ValueError if the schedule
    deadlocks (a stage waits on something that its order never lets happen), naming the first
    action that can never run and what it waits for.
    """
    validate(schedule)
    try:
        timed = play_timed(schedule, lambda a: 1)
    except Deadlock as e:
        raise ValueError(f"{schedule.name}: deadlock at slot {e.at}; {_stuck(schedule, e.next)}") from None
    grid: list[list[Action | None]] = [[None] * timed.span for _ in timed.rows]
    for r, row in enumerate(timed.rows):
        for a in row:
            grid[r][timed.start[a]] = a
    return Timeline(tuple(tuple(r) for r in grid))


def _stuck(schedule: Schedule, nxt: Sequence[int]) -> str:
    """What a deadlocked schedule waits on: the first device's next action, which can never run, the
    action it needs, and what that action's device runs first."""
    rows = schedule.actions
    r = next(r for r, row in enumerate(rows) if nxt[r] < len(row))
    action = rows[r][nxt[r]]
    need = next(
        d
        for d in dependencies(action, schedule.stages)
        if d not in rows[schedule.row(d.stage)][: nxt[schedule.row(d.stage)]]
    )
    q = schedule.row(need.stage)
    head = rows[q][nxt[q]]
    if not schedule.stage_rows:
        return (
            f"{action} of stage {r} (its action {nxt[r] + 1}) can never run: it needs {need} of stage {q}, "
            f"which stage {q} runs only after {head}, itself waiting"
        )
    return (
        f"{_cell(schedule, action)} (action {nxt[r] + 1} of device {r}) can never run: it needs "
        f"{_cell(schedule, need)}, which device {q} runs only after {_cell(schedule, head)}, itself waiting"
    )


def live_activations(row: Sequence[Action]) -> list[int]:
    """Microbatches whose activations a stage holds after each action of `row` (forwards minus
    backwards done; in a split schedule, minus W's done: W still reads what the forward saved)."""
    release = WEIGHT if any(a.kind == WEIGHT for a in row) else BACKWARD
    live, out = 0, []
    for a in row:
        live += 1 if a.kind == FORWARD else -1 if a.kind == release else 0
        out.append(live)
    return out


def held_counts(schedule: Schedule) -> list[int]:
    """Per stage, the most microbatches whose activations it holds at once in `schedule` (forwards
    done minus backwards done, or W's in a split schedule): GPipe M on every stage, 1F1B
    min(M, K-k) on stage k. What `chain.planning.footprint` multiplies a microbatch's activations by."""
    out = []
    for k in range(schedule.stages):
        mine = [a for a in schedule.actions[schedule.row(k)] if a.stage == k]
        out.append(max(live_activations(mine), default=0))
    return out


def output_gradients_held(schedule: Schedule) -> list[int]:
    """Per stage, how many microbatches' layer-output gradients a split schedule (zb1) adds to its
    busiest moment: B keeps the gradients at each layer's output until W reads them, each set as
    large as the layer outputs themselves. The most of activations plus those gradients held at
    once, less `held_counts`; 0 on a stage without W's."""
    out = []
    for k in range(schedule.stages):
        mine = [a for a in schedule.actions[schedule.row(k)] if a.stage == k]
        if not any(a.kind == WEIGHT for a in mine):
            out.append(0)
            continue
        live, waiting, both = live_activations(mine), 0, []
        for a, held in zip(mine, live):
            waiting += 1 if a.kind == BACKWARD else -1 if a.kind == WEIGHT else 0
            both.append(held + waiting)
        out.append(max(both) - max(live))
    return out


def backward_at_once(schedule: Schedule) -> frozenset[tuple[int, int]]:
    """The (stage, microbatch) pairs whose backward is their device's very next action after their
    forward and waits for no other stage: the last stage's (its backward starts from its own loss),
    as in every step of 1F1B's steady state there. Recomputing such a forward (`pipeline.recompute`)
    would only rebuild, at once, what the forward's tape holds at that moment: the same memory, for
    one more forward, so `chain.pipeline.play` keeps their activations under every policy."""
    last = schedule.stages - 1
    row = schedule.actions[schedule.row(last)]
    return frozenset(
        (a.stage, a.microbatch)
        for a, b in zip(row, row[1:])
        if a == Action(last, a.microbatch, FORWARD) and b == Action(last, a.microbatch, BACKWARD)
    )


def rows(
    timeline: Timeline,
    devices: Sequence[str] | None = None,
    schedule: Schedule | None = None,
    replicas: int = 1,
    marked: Sequence[Action | None] = (),
    running: Sequence[Sequence[bool]] = (),
) -> list[str]:
    """The timeline's grid as text, one line per stage/device, one column per slot (`render`'s body).
    `devices[k]` is stage k's device; a `schedule` whose devices hold several stages labels each
    row with its device and stages, and each cell with its stage (`F3@s2`). With `replicas` copies
    of the pipeline the grid holds copy 0's stages, then copy 1's, ...: each row says its copy.
    `marked[i]`: the action of row i drawn `>F2` (a stalled step's, `chain.pipeline.stalled`).
    `running[i][t]`: row i's empty cell t drawn `-` (still running an action to its left: a measured
    step's, `chain.pipeline.measured_grid`), not `.` (idle).

        stage 0  /device:CPU:0  F0 F1 .  .  B0 B1
    """
    shared = schedule is not None and bool(schedule.stage_rows)
    plain = (lambda a: _cell(schedule, a)) if shared else str
    mark = list(marked) + [None] * (len(timeline.grid) - len(marked))
    width = max([len(plain(a)) for row in timeline.grid for a in row if a is not None] or [1]) + any(mark)
    if shared:
        mine = [schedule.row_stages(r) for r in range(len(timeline.grid))]
        labels = [
            f"device {r} (stages {', '.join(map(str, ks))})" + (f"  {devices[ks[0]]}" if devices else "")
            for r, ks in enumerate(mine)
        ]
    else:
        per = len(timeline.grid) // max(1, replicas)
        copy = (lambda i: f"copy {i // per} ") if replicas > 1 else (lambda i: "")  # noqa: E731
        labels = [
            f"{copy(i)}stage {i % per}" + (f"  {devices[i]}" if devices else "") for i in range(len(timeline.grid))
        ]
    pad = max(len(s) for s in labels)
    lines = []
    flag = (lambda a, here: ">" if a is not None and a == here else " ") if any(mark) else (lambda a, here: "")

    def empty(i: int, t: int) -> str:
        return RUNNING if i < len(running) and t < len(running[i]) and running[i][t] else IDLE

    for i, (label, row, here) in enumerate(zip(labels, timeline.grid, mark)):
        cells = " ".join(
            (flag(a, here) + (plain(a) if a is not None else empty(i, t))).ljust(width) for t, a in enumerate(row)
        )
        lines.append(f"{label.ljust(pad)}  {cells}".rstrip())
    return lines


def render(schedule: Schedule, timeline: Timeline, devices: Sequence[str] | None = None) -> str:
    """The timeline as text: a header, one row per stage/device, one column per slot, then the bubble."""

    def count(n: int, word: str, words: str) -> str:  # `1 microbatch`, `2 microbatches` (nothing of chain here)
        return f"{n} {word if n == 1 else words}"

    on = f" on {count(schedule.devices, 'device', 'devices')}" if schedule.stage_rows else ""
    lines = [
        f"schedule: {schedule.name}, {count(schedule.stages, 'stage', 'stages')}{on} x "
        f"{count(schedule.microbatches, 'microbatch', 'microbatches')}, "
        f"{count(timeline.slots, 'slot', 'slots')} (F: forward, B: backward{_w_legend(schedule)}, digit: microbatch, .: idle)"
    ]
    lines += rows(timeline, devices, schedule)
    lines.append(f"bubble fraction: {timeline.bubble_fraction:.3f} (idle slots / all slots)")
    return "\n".join(lines)


def _w_legend(schedule: Schedule) -> str:
    return " (input gradient), W: weight gradients" if is_split(schedule) else ""
