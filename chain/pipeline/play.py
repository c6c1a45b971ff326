"""mode=e2e: the chain as one network, trained by a pipeline schedule in one `tf.function`.

The batch is cut into M equal microbatches. Every action of the schedule becomes ops
inside its stage's device scope:

- F(k, m): copy microbatch m's activation from stage k-1 (stage 0: its slice of the
  input) onto stage k's device, run stage k's model under a GradientTape. The last
  stage also computes the loss of microbatch m, divided by M so that the sum over
  microbatches is the full-batch mean loss (with `ignore_class`, its mean over its real labels
  times its share of the batch's real labels instead, counted from the labels before any
  backward: `chain.stages.losses.Loss.weights`). Every stage adds its model's regularization
  (`model.losses`, as Keras' `fit`) on its device, inside its tape, divided by M too; a
  stage before the last starts its backward from it as well, and sends its sum over the
  microbatches to the last stage, where the chain's loss is reported.
- B(k, m): copy dL/d(output) from stage k+1 onto stage k's device (the last stage
  starts from its loss), `tape.gradient(output, [input] + variables,
  output_gradients=g)`, and add the variable gradients to stage k's accumulator. Each
  layer's weight-gradient products run before the gradient goes on past the layer
  (`weights_first`: control edges only), so a backward holds about one layer's gradient at a
  time, not every layer's at once.

With `pipeline.recompute` (`chain.steps.recompute`), F(k, m) of a recomputed microbatch runs
without a tape and keeps only its input and the stage model's state; B(k, m) runs the
forward again from them under a tape before taking its gradient. The last stage keeps its
activations when its backward is its very next action (`schedules.backward_at_once`: every
microbatch under 1F1B): a replay there would rebuild the same tensors at the same moment.
Otherwise (GPipe) the last stage's recomputed F keeps only its input and runs nothing: its
output goes nowhere but into its loss, so its forward runs once, in B, and the loss is
reported from there (`deferred_forwards`).

After its last backward, each stage applies its accumulated gradients once through
`chain.steps.update.apply_update`, so every schedule computes the full-batch update.

Gradient accumulation (`trainer.grad_accum=N`): a step's batch is N chunks of
`data.batch_size`, and the schedule runs N times in a row ("rounds"), round r on
chunk r's M microbatches (numbered r*M .. r*M+M-1), accumulating into the same sums;
each microbatch's loss is divided by N*M. The update comes after the last round, so it
is the update of the whole N x batch_size batch, while each round holds only as many
activations as the schedule does for one batch.

Under float16 loss scaling the last stage differentiates its scaled loss, and after
the last backward the whole chain takes one loss-scale decision
(`chain.steps.update.shared_outcomes`): every stage unscales by the same scale and all skip
together on an overflow.

With `optim.clip_global_norm` the unscaled, accumulated gradients are then clipped by the
chain's global norm (`chain.steps.clipping`: one scalar per stage to the last stage's device,
the factor back); with `pipeline.batch_norm=deferred` each stage's update also updates its
BatchNormalization moving statistics once, from every microbatch of the step
(`chain.steps.deferred_norm`).

A dataflow graph runs any op whose inputs are ready, so the order a schedule gives a
stage would be lost, and with it 1F1B's bound on live activations: every action's ops
are created under `tf.control_dependencies` on the previous action of the same stage (of the
same device, when interleaved stages share one: `Schedule.row`).
Copies belong to the receiving action, so an activation is used on a device only when
that device's schedule has reached it. Actions are traced in the order of the
schedule's simulated timeline, a topological order of all their dependencies
(`tf.function`'s automatic control dependencies order stateful ops, such as a dropout
seed update, by trace order, so they cannot contradict the schedule's order).

Sends go out when they are produced. After an action whose result goes to another
device, the stage's next action waits not on the action's end directly but on a
*release*: an op on the host (`host()`, the client's CPU in a cluster) that runs after
it. Without it, on a device whose executor has one thread (a CPU worker with one
inter-op thread, as `scripts/bench_pipeline.py` measures), the chained actions of a stage
run back to back on that thread, and an op that becomes ready meanwhile (the `_Send` that
TensorFlow inserts for each edge between devices) waits in the thread pool's queue until
the chain stops: GPipe's first stage sent its first activation after its last forward, so
the next stage idled through the whole fill (docs/benchmarks-in-code.md). The
release stops the chain after each such action; the queued send goes out while the round
trip to the host (a fraction of a millisecond) lets the stage go on. The order of each
stage's actions, and so 1F1B's bound, is unchanged: the release only adds a wait. Where the
stage's next action is a forward whose input comes from another process, that receive stops the
chain already, and the release is left out (`released`).

The code follows the same shape: `play_schedule` walks the schedule's actions and `play_action` calls the
handler of each action's kind from `HANDLERS` (forward, backward, and a split schedule's input and weight
gradients); what an action leaves for a later one is a named record (`Forwarded`, `Replayable`, `Waiting`,
`Halfway`) in the play's one `PlayState`; what every play shares is one frozen `Playbook`, its options
one `StepOptions`. The benchmarks leave a piece of this machinery out by patching the function that adds
it (`chained`, `release`, `weights_first`, `summed_in_turn`: scripts/ablations.py), not by an option.
"""

from __future__ import annotations

import contextlib
import dataclasses
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import tensorflow as tf

from chain import testhooks
from chain.config.checks import BatchCut
from chain.data.catalog import Target
from chain.internals.keras_private import all_layers
from chain.internals.tf_private import add_control_input, host_address_space
from chain.pipeline.progress import Progress
from chain.schedule.schedules import (
    BACKWARD,
    DONE,
    FORWARD,
    WEIGHT,
    Action,
    Schedule,
    backward_at_once,
    is_split,
    rounds,
    simulate,
    update_scope,
)
from chain.planning.devices import canonical
from chain.stages.stage import Stage
from chain.stages.tied_weights import later_copies
from chain.steps import xla
from chain.steps.clipping import clip_global
from chain.steps.deferred_norm import Deferred, Pooled
from chain.steps.forward import Kept, chain_forward, layer_by_layer
from chain.steps.ops import add_grads, chunks_of, copy_to, differentiable, input_gradient
from chain.steps.recompute import NEVER, recomputed, replay, snapshot
from chain.steps.report import dropped, report
from chain.steps.tied import lend_back, sum_shared
from chain.steps.update import shared_outcomes, stage_update, unscale


def activation_copy(stage: int, microbatch: int) -> str:
    """The `copy_to` name of microbatch `microbatch`'s activation arriving at `stage`."""
    return f"act_s{stage}_mb{microbatch}"


def gradient_copy(stage: int, microbatch: int) -> str:
    """The `copy_to` name of microbatch `microbatch`'s output gradient arriving at `stage`."""
    return f"grad_s{stage}_mb{microbatch}"


def regularization_total(regs: Sequence[Sequence[tf.Tensor]], stages: Sequence[Stage], device: str) -> list[tf.Tensor]:
    """Each stage's weighted regularization terms (`regs[k]`, one per microbatch) summed on its
    device and copied to `device`, where the chain's loss is reported (empty for a stage with none)."""
    out = []
    for s, terms in zip(stages, regs):
        if terms:
            with tf.device(s.device):
                total = tf.add_n(list(terms), name=f"regularization_s{s.index}")
            out.append(copy_to(total, device, f"regularization_s{s.index}"))
    return out


def _done(ops: Sequence[tf.Operation], device: str) -> tf.Operation:
    """A no-op on `device` that runs after every op of an action (not only after its result:
    an action may leave side branches, such as a shape computation nobody reads)."""
    with tf.device(device):
        return tf.group(*[op for op in ops if op.type != "Placeholder"], name=DONE)


def _finished(ops: Sequence[tf.Operation], device: str) -> tf.Operation:
    """A no-op on `device` that runs after an action's last ops (those whose results no other op of
    `ops` reads), for the stall markers of a step whose actions are not chained (one microbatch).

    It waits on an identity of each of their results, not on them: a control edge out of an op
    that Grappler's remapper would fuse with the ops before it (a layer's MatMul, BiasAdd and
    activation) keeps the fusion from happening, and the unfused kernels round otherwise (float16
    drifted from Keras' own step by 4e-5 in tests/test_clipping.py); an identity is a reader like
    any other."""
    mine = set(ops)
    last = [op for op in ops if not any(c in mine for t in op.outputs for c in t.consumers())]
    with tf.device(device):
        ends = [
            tf.identity(t).op if t.dtype not in (tf.resource, tf.variant) else op for op in last for t in op.outputs[:1]
        ] + [op for op in last if not op.outputs]
        return tf.group(*ends, name=DONE)


def host() -> str:
    """This process's CPU, fully named (`/job:localhost/replica:0/task:0/device:CPU:0`); in a
    cluster, the client's. (A partial `/device:CPU:0` leaves the job and task to the placer,
    which may pick a worker's CPU, a stage's own included.)"""
    return host_address_space() + "/device:CPU:0"


def host_of(device: str) -> str:
    """The CPU of the process that holds `device`: a cluster worker's own (`/job:worker/.../device:CPU:0`),
    else this process's (`host()`)."""
    name = canonical(device)
    return name.split("/device:")[0] + "/device:CPU:0" if name.startswith("/job:") else host()


def row_hosts(schedule: Schedule, copies: Sequence[Sequence[Stage]]) -> list[str]:
    """Each device row's `host_of`, copy by copy (the rows of `chain.pipeline.progress.Progress`)."""
    return [host_of(copy[schedule.row_stages(r)[0]].device) for copy in copies for r in range(schedule.devices)]


def sends(action: Action, devices: Sequence[str]) -> bool:
    """Whether `action`'s result goes to another device: a forward's activation to stage k+1,
    a backward's input gradient to stage k-1 (the last forward and the first backward send
    nothing, nor does an action whose neighbour shares its device)."""
    k, kind = action.stage, action.kind
    if kind == WEIGHT:
        return False  # W's gradients stay on the stage
    to = k + 1 if kind == FORWARD else k - 1
    return 0 <= to < len(devices) and canonical(devices[k]) != canonical(devices[to])


def receives(action: Action, devices: Sequence[str]) -> bool:
    """Whether `action`'s input comes from another process: a forward's activation from stage k-1, a
    backward's output gradient from stage k+1, on a device of another cluster worker (or the client)."""
    k, kind = action.stage, action.kind
    if kind == WEIGHT:
        return False
    source = k - 1 if kind == FORWARD else k + 1
    return 0 <= source < len(devices) and host_of(devices[k]) != host_of(devices[source])


def released(order: Sequence[Action], schedule: Schedule, devices: Sequence[str]) -> frozenset[Action]:
    """The actions after which the stage goes on only through a release (`release`): those that send to
    another device, unless the next action of their device row is a forward that receives from another
    process. That receive is a remote call the worker makes when the forward starts and that is answered
    later, and a forward's ops (its weight reads aside) wait for its input: the row's chain of ready ops
    stops there as at a release, and the queued send goes out meanwhile; a release would only add its round
    trip to the host (measured on CPU workers: docs/benchmarks.md). A backward's first ops need only its own
    activations and keep the chain going past its receive; a receive within one process may be ready at
    once: both keep their release, as does a row's last action (the update that follows may not wait)."""
    rows: dict[int, list[Action]] = {}
    for a in order:
        rows.setdefault(schedule.row(a.stage), []).append(a)
    out = set()
    for row in rows.values():
        for a, after in zip(row, [*row[1:], None]):
            stops = after is not None and after.kind == FORWARD and receives(after, devices)
            if sends(a, devices) and not stops:
                out.add(a)
    return frozenset(out)


def release_name(action: Action) -> str:
    """The name of the host op that lets a stage go on after `action` (`release_s0_F1`)."""
    return f"release_{action.scope()}"


def release(done: tf.Operation, action: Action) -> tf.Operation:
    """An op on the host that runs after `done`: the stage's next action waits for it.

    A draw of one seeded random number, because Grappler leaves it alone: it turns a
    constant that only feeds control edges into a no-op, and its dependency optimizer
    removes a no-op or identity between two ops of one device, and the round trip with it.
    (A legacy random op is also the one kind of stateful op that `tf.function` does not
    chain to the others.)"""
    with tf.device(host()), tf.control_dependencies([done]):
        return tf.raw_ops.RandomUniform(shape=[1], dtype=tf.float32, seed=1, seed2=1, name=release_name(action)).op


def _seeds(out: tf.Tensor, g: tf.Tensor | None, scaled_reg: tf.Tensor | None) -> tuple:
    """(targets, their output gradients) that a stage's backward starts from: its output with dL/doutput
    (the last stage: its loss, from 1), and the stage's own regularization term, from 1."""
    if not tf.is_tensor(out):  # several tensors cross: the floating ones, each with its gradient
        out = differentiable(out)
        g = [None] * len(out) if g is None else list(g)
        if scaled_reg is None:
            return out, g
        return [*out, scaled_reg], [*g, tf.ones_like(scaled_reg)]
    if scaled_reg is None:
        return out, g
    return [out, scaled_reg], [g, tf.ones_like(scaled_reg)]


def deferred_forwards(order: Sequence[Action], last: int, replayed: Callable[[int, int], bool]) -> frozenset[int]:
    """The microbatches (numbered over all rounds) whose forward on the last stage waits for their
    backward and runs there once, instead of once in F and again in B's replay.

    A recomputed forward of a stage before the last must run in F, since the next stage needs its
    output; the last stage's output goes nowhere but into its own loss, which its backward
    recomputes anyway: its F need only keep the input. Deferring keeps the results bit for bit when
    the last stage's forwards still run in the order of its F actions (its model's state, dropout
    seeds and batch-norm statistics, advances forward by forward): so every recomputed microbatch
    is deferred, or none (GPipe's backwards run in the forwards' order; under `except_last` the kept
    last microbatch would run first, and nothing is deferred)."""
    mine = [a for a in order if a.stage == last]
    forwards = [a.microbatch for a in mine if a.kind == FORWARD]
    waiting = {m for m in forwards if replayed(last, m)}
    runs = [
        a.microbatch for a in mine if a.kind == (BACKWARD if a.microbatch in waiting else FORWARD) and a.kind != WEIGHT
    ]
    return frozenset(waiting) if runs == forwards else frozenset()


def weight_gradients(
    stage: Stage,
    targets,
    start,
    kept: Sequence[Kept] | None,
    kept_grads: Sequence[tf.Tensor | None],
    inputs: Sequence[tf.Tensor] = (),
) -> list[tf.Tensor | None]:
    """W of a split backward: the gradients of `stage`'s `gradient_variables` (in their order).

    With every weighted layer's call kept (`kept`: its inputs and output, and `kept_grads`, the
    gradients B computed at those outputs), each call gives the weights it reads their gradient from
    its own output's, differentiated back to its inputs only: only that layer's backward runs again
    (its activation's derivative, elementwise, and the weight products), not the whole stage's. A
    weight read by several calls (tied) sums what each gives. What reaches the weights otherwise (a
    kernel regularizer's term in `targets`) is added with the kept outputs held fixed. Without them
    (a model `layer_by_layer` refuses, or XLA), the whole backward runs again from `targets`
    (`start`: their output gradients). `tf.gradients` names its ops in the current scope
    (`s{k}_W{m}/gradients/...`), so a trace reads them back as W. `inputs` (the stage's input) stop
    the walk: `tf.gradients` follows the graph, not a tape, and past the stage's input it would reach
    the earlier stages' uses of a weight the stage borrows (`Stage.borrowed`) and count them again."""
    variables = stage.gradient_variables
    handles = [v.value if hasattr(v, "value") else v for v in variables]  # Keras 3 wraps the tf.Variable
    if kept is None:
        return tf.gradients(targets, handles, grad_ys=start, stop_gradients=list(inputs))
    total: list[tf.Tensor | None] = list(
        tf.gradients(targets, handles, grad_ys=start, stop_gradients=[c.output for c in kept] + list(inputs))
    )
    for call, grad in zip(kept, kept_grads):
        if grad is None:
            continue
        # The call's own weights first (the common case); any other weight it reads (tied) too.
        for i, g in enumerate(tf.gradients(call.output, handles, grad_ys=grad, stop_gradients=call.inputs)):
            if g is not None:
                total[i] = g if total[i] is None else total[i] + g
    return total


def weights_first(weight_grads: Sequence[tf.Tensor | None], ops: Sequence[tf.Operation]) -> int:
    """Make each layer's weight-gradient products run before the backward goes on past the layer:
    every other consumer of a gradient that a weight's gradient reads (the product that carries the
    gradient on to the layer's input) waits for that weight's gradient. Returns the edges added.

    Without it the executor runs the chain of input-gradient products first, the backward's
    critical path, and leaves the weight products queued behind it: every layer's output gradient
    and the activation its weight product reads then stay alive at once, as the memory trace of
    GPipe `always` shows (`chain.pipeline.memory_trace`; docs/benchmarks-in-code.md). With the edges a
    backward holds about one layer's gradient at a time.
    Only the order changes: the same ops on the same inputs, so the same bits. `ops` are the ops of
    the backward (the action's, from its first); an edge that would close a cycle is left out."""
    mine = set(ops)
    if not mine:
        return 0
    products = {g.op for g in weight_grads if isinstance(g, tf.Tensor)}  # the ops that give a weight's gradient
    added = 0
    for g in weight_grads:
        if not isinstance(g, tf.Tensor) or g.op not in mine:
            continue
        w = g.op
        while w.type == "Identity" and w.inputs and w.inputs[0].op in mine:  # the product behind a pass-through
            w = w.inputs[0].op
        # The other readers of the gradients it reads (an activation's other readers are the forward's).
        gradients = [t for t in w.inputs if t.op in mine and t.op.name.startswith(_GRADIENT_SCOPE)]
        later = list(
            dict.fromkeys(
                c
                for t in gradients
                for c in t.consumers()
                if c is not w and c in mine and w not in c.control_inputs and c not in products
            )
        )
        ancestors = _ancestors(w, mine) if later else set()
        for c in later:
            if c not in ancestors:
                add_control_input(c, w)  # the graph is still being built
                added += 1
    return added


_GRADIENT_SCOPE = "gradient_tape/"


def summed_in_turn(sums: Sequence, done: Sequence[tf.Operation]) -> list[tf.Operation]:
    """The ops of a W's running gradient sums not already in `done`, for the stage's next action to wait on.

    Otherwise nothing reads a W's partial sum but the next W's addition, and Grappler's arithmetic
    optimizer folds the stage's whole chain of additions into one AddN over every microbatch's
    gradients: each W's weight gradients then stay alive until the stage's last W (zb1's memory trace:
    docs/benchmarks-in-code.md). The results are bit for bit the folded sum's (`tests/test_pipeline.py`)."""
    done = set(done)
    return [t.op for t in sums if isinstance(t, tf.Tensor) and t.op not in done]


def _ancestors(op: tf.Operation, within: set) -> set:
    """The ops of `within` that `op` depends on, through data and control edges."""
    seen, todo = set(), [op]
    while todo:
        o = todo.pop()
        for p in [t.op for t in o.inputs] + list(o.control_inputs):
            if p in within and p not in seen:
                seen.add(p)
                todo.append(p)
    return seen


def e2e_step(
    stages: Sequence[Stage],
    schedule: Schedule,
    loss: Callable,
    target: Target,
    grad_accum: int = 1,
    jit_compile: bool = False,
    clip_global_norm: float | None = None,
    batch_norm: str = "microbatch",
    recompute_policy: str = NEVER,
    progress: Progress | None = None,
    batch_cut: BatchCut | None = None,
) -> Callable:
    """The training step of `schedule` over `stages`, traceable: `step(x, ys) -> report` (each
    stage's guard flag, then the mean batch loss and, with `clip_global_norm`, the global
    gradient norm: `Layout.chain`).

    `loss(y, pred)` is the mean loss of one microbatch; `target` names the entry of
    `ys` that the last stage learns. `grad_accum` rounds of the schedule make one
    update; `jit_compile` compiles each stage's forward (with its gradient) and update
    with XLA (`chain.steps.xla`).
    `clip_global_norm=C` clips the accumulated, unscaled gradients of every stage by their
    global norm (`chain.steps.clipping`, computed on the last stage's device).
    `batch_norm="deferred"` updates every BatchNormalization layer's moving statistics once,
    from the whole batch, in each stage's update (`chain.steps.deferred_norm`).
    `recompute_policy` (`pipeline.recompute`): which microbatches keep only their input and run
    their forward again in their backward (`chain.steps.recompute`).
    `progress` (`trainer.stall_s`): the markers each action updates when it is done, on its device's host
    (`chain.pipeline.progress`), so a stalled step can say where it waits. `batch_cut`: how the run
    cuts a batch (`RunSpec.batch_cut`): its microbatches, which `schedule` must play (None: the
    schedule's own count, for a step made by hand).
    """
    play = e2e_play(
        stages,
        schedule,
        loss,
        target,
        grad_accum,
        jit_compile,
        recompute_policy,
        progress=progress,
        batch_cut=batch_cut,
    )
    updates = [stage_update(s, jit_compile) for s in stages]
    deferred = Deferred(stages) if batch_norm == "deferred" else None

    def step(x: tf.Tensor, ys: dict[str, tf.Tensor]) -> tf.Tensor:
        with deferred.recording() if deferred else contextlib.nullcontext():
            base = progress.begin([x]) if progress else None
            return finish(stages, schedule, updates, play(x, ys, base), clip_global_norm, deferred)

    return step


@dataclass
class Played:
    """What one play of the schedule leaves for the update: each stage's summed (still loss-scaled)
    gradients on its device, the batch's loss on the last stage's device (every stage's
    regularization included), and each device row's last action (the update waits for it)."""

    grads: list[list[tf.Tensor]]
    total: tf.Tensor
    previous: list[list[tf.Operation]]


@dataclass(frozen=True)
class StepOptions:
    """How a step plays its schedule (`e2e_step` says what each option does; `replica`: the copy of the
    pipeline whose actions these are; `progress`: the stall markers, `trainer.stall_s`)."""

    grad_accum: int = 1
    jit_compile: bool = False
    recompute_policy: str = NEVER
    replica: int = 0
    progress: Progress | None = None


@dataclass(frozen=True)
class Taped:
    """Stage k's forward on one microbatch under a tape that watches its input."""

    tape: tf.GradientTape
    output: tf.Tensor  # what its backward differentiates: the output, or the last stage's scaled loss
    value: tf.Tensor | None  # reported: the last stage's loss, else its weighted regularization (or None)
    scaled_reg: tf.Tensor | None  # the scaled regularization the backward starts from too (last stage: None)
    kept: Sequence[Kept] | None  # a split backward's kept layer outputs


@dataclass(frozen=True)
class Forwarded:
    """F → B: a forward that kept its tape."""

    input: tf.Tensor
    taped: Taped


@dataclass(frozen=True)
class Replayable:
    """F → B: a recomputed forward kept only its input and its model's state before it (`snapshot`)."""

    input: tf.Tensor
    state: list[tf.Tensor]


@dataclass(frozen=True)
class Waiting:
    """F → B: a deferred forward of the last stage kept its input only; B runs it, once."""

    input: tf.Tensor


@dataclass(frozen=True)
class Halfway:
    """B → W of a split backward: what the weights' gradients start from."""

    targets: list[tf.Tensor] | tf.Tensor
    start: list[tf.Tensor | None] | tf.Tensor | None  # the targets' output gradients
    kept: Sequence[Kept] | None
    kept_grads: list[tf.Tensor | None]  # the gradients B computed at the kept outputs
    input: Any  # the stage's input, a tensor or a structure (where W's walk back stops)
    weights: list[tf.Tensor | None] | None = None  # the weights' gradients, when B took them (`whole_backward`)


@dataclass(frozen=True)
class Playbook:
    """What every play of one step's schedule shares, worked out once (`playbook`)."""

    stages: Sequence[Stage]
    schedule: Schedule
    target: Target
    options: StepOptions
    microbatches: int  # each round's batch cut into this many (the run's `BatchCut`; the schedule's count)
    order: list[Action]  # every action, in the order traced (the simulated timeline's, over the rounds)
    ordered: bool  # each stage's actions chained in the schedule's order
    released: frozenset[Action]  # the actions the stage goes on from only through a release (`released`)
    at_once: frozenset[tuple[int, int]]  # kept under every recompute policy (`backward_at_once`)
    deferred: frozenset[int]  # the last stage's forwards that run once, in B (`deferred_forwards`)
    split: bool  # B and W: the input's gradient, then the weights'
    keeps: tuple[bool, ...]  # per stage: whether its forward keeps every layer's output (split only)
    whole: tuple[bool, ...]  # per stage: whether B takes the weights' gradients too (split only: `whole_backward`)
    forwards: tuple[Callable, ...]  # per stage: its forward (`chain_forward`, compiled with XLA if asked)
    loss_weights: Callable | None = None  # the microbatches' labels -> their weights in the loss (None: 1/M)

    @property
    def last(self) -> int:
        return len(self.stages) - 1

    @property
    def n_micro(self) -> int:
        """Microbatches per step, over all rounds."""
        return self.microbatches * self.options.grad_accum

    def replayed(self, k: int, m: int) -> bool:
        """Whether F(k, m) keeps only its input and B(k, m) runs it again (`m` over all rounds)."""
        within = m % self.schedule.microbatches
        return (
            recomputed(self.options.recompute_policy, within, self.schedule.microbatches)
            and (k, within) not in self.at_once
        )

    def kind(self, action: Action) -> str:
        """The handler `action` needs (`HANDLERS`): a split schedule's B is an input gradient."""
        return INPUT_GRADIENT if action.kind == BACKWARD and self.split else action.kind


@dataclass
class PlayState:
    """One play's state while its actions are traced (`_start`): the microbatches and what actions leave
    for later ones, keyed by (stage, microbatch)."""

    xs: list[tf.Tensor]  # the input's microbatches, on stage 0's device
    labels: list[tf.Tensor]  # their labels, on the last stage's device
    loss_weights: list[tf.Tensor] | None  # each microbatch's weight in the loss, where not 1/M (`Loss.weights`)
    base: tf.Tensor | None  # `Progress.begin`'s, when the markers are set
    marked: bool
    graph: tf.Graph
    saved: dict[tuple[int, int], Forwarded | Replayable | Waiting] = field(default_factory=dict)  # F → B
    halfway: dict[tuple[int, int], Halfway] = field(default_factory=dict)  # split: B → W
    outputs: dict[tuple[int, int], tf.Tensor] = field(default_factory=dict)  # forward results waiting for stage k+1
    input_grads: dict[tuple[int, int], tf.Tensor] = field(default_factory=dict)  # dL/dinput waiting for stage k-1
    accumulated: list[list | None] = field(default_factory=list)  # each stage's gradient sums
    previous: list[list[tf.Operation]] = field(default_factory=list)  # each device row's last action's `done`
    microbatch_losses: list[tf.Tensor | None] = field(default_factory=list)  # the last stage's, in its forwards' order
    loss_slot: dict[int, int] = field(default_factory=dict)  # a deferred forward's microbatch -> its place above
    regs: list[list[tf.Tensor]] = field(default_factory=list)  # stages before the last: weighted regularization
    finished: list[int] = field(default_factory=list)  # each row's actions traced so far (its marker's count)


INPUT_GRADIENT = "B_input"  # the key of a split backward's B in `HANDLERS` (its actions' kind stays "B")


def e2e_play(
    stages: Sequence[Stage],
    schedule: Schedule,
    loss: Callable,
    target: Target,
    grad_accum: int = 1,
    jit_compile: bool = False,
    recompute_policy: str = NEVER,
    replica: int = 0,
    progress: Progress | None = None,
    batch_cut: BatchCut | None = None,
) -> Callable:
    """`play(x, ys, base) -> Played`: `e2e_step` up to the update (its arguments), traceable; a replicated
    pipeline (`chain.pipeline.replicas`) plays it once per copy (`replica`: its actions' scopes say
    which, `Action.scope`) and averages the gradients over the copies first. With `progress`, `base`
    (`Progress.begin`'s, once per step) starts the values of the markers each action sets when done."""
    options = StepOptions(grad_accum, jit_compile, recompute_policy, replica, progress)
    book = playbook(stages, schedule, loss, target, options, batch_cut)

    def play(x: tf.Tensor, ys: dict[str, tf.Tensor], base: tf.Tensor | None = None) -> Played:
        return play_schedule(book, x, ys, base)

    return play


def playbook(
    stages: Sequence[Stage],
    schedule: Schedule,
    loss: Callable,
    target: Target,
    options: StepOptions,
    batch_cut: BatchCut | None = None,
) -> Playbook:
    """The `Playbook` of `schedule` over `stages`, each round's batch cut as `batch_cut` says (None:
    into the schedule's microbatches); refuses a schedule the stages or the cut cannot play."""
    microbatches = schedule.microbatches if batch_cut is None else batch_cut.microbatches
    _refuse_unplayable(stages, schedule, options, microbatches)
    order = rounds(simulate(schedule).order(), schedule.microbatches, options.grad_accum, options.replica)  # validates
    split = is_split(schedule)
    # A split backward keeps each layer's output where the model allows (XLA's shows none): W starts from B's gradients there.
    whole = tuple(split and whole_backward(s) for s in stages)
    keeps = tuple(split and not w and not options.jit_compile and layer_by_layer(s) for s, w in zip(stages, whole))
    book = Playbook(
        stages,
        schedule,
        target,
        options,
        microbatches,
        order,
        chained(schedule, options.grad_accum),
        released(order, schedule, [s.device for s in stages]),
        at_once=backward_at_once(schedule),  # kept under every policy: a replay would hold the same, at once
        deferred=frozenset(),
        split=split,
        keeps=keeps,
        whole=whole,
        forwards=_forwards(stages, loss, keeps, options.jit_compile),
        loss_weights=getattr(loss, "weights", None),
    )
    return dataclasses.replace(book, deferred=deferred_forwards(order, len(stages) - 1, book.replayed))


def whole_backward(stage: Stage) -> bool:
    """Whether a split backward's B takes the stage's weight gradients too, W only adding them to the sums: when
    a layer holds layers with weights (a transformer block), W would run that layer's whole backward again (it
    starts from the layer's output), which costs about what B did (docs/benchmarks-in-code.md). B's gradients
    then wait in memory for W, one set per microbatch between."""
    return any(
        sub is not layer and sub.trainable_weights
        for layer in stage.model.layers
        if layer.trainable_weights
        for sub in all_layers(layer)
    )


def chained(schedule: Schedule, grad_accum: int) -> bool:
    """Whether each stage's actions are chained in the schedule's order (and released after sends).

    With one microbatch a stage has one forward and one backward, which its data already orders (the
    backward reads the forward's tape): the chaining would bound nothing and only make each action wait
    for the previous one's side branches, and the releases exist only to break that chain. Leaving both
    out changes no value (stateful ops stay in trace order)."""
    return schedule.microbatches * grad_accum > 1


def _refuse_unplayable(stages: Sequence[Stage], schedule: Schedule, options: StepOptions, microbatches: int) -> None:
    if schedule.stages != len(stages):
        raise ValueError(f"schedule for {schedule.stages} stages, chain has {len(stages)}")
    if microbatches != schedule.microbatches:
        raise ValueError(
            f"{schedule.name} plays {schedule.microbatches} microbatches, the batch is cut into {microbatches}"
        )
    if options.recompute_policy != NEVER and is_split(schedule):
        raise ValueError(f"{schedule.name}: a split backward (B and W) does not recompute (recompute_policy=NEVER)")
    for r in range(schedule.devices):  # a row's order is one device's: its stages must share that device
        if len({canonical(stages[k].device) for k in schedule.row_stages(r)}) > 1:
            raise ValueError(
                f"{schedule.name}: stages {schedule.row_stages(r)} share a row of the schedule but not a device"
            )


def _forwards(stages: Sequence[Stage], loss: Callable, keeps: tuple[bool, ...], jit_compile: bool) -> tuple:
    """Each stage's forward as one traced function (the last one's with the loss)."""
    last = len(stages) - 1
    return tuple(
        xla.stage_function(
            chain_forward(s, loss if s.index == last else None, keeps[s.index]),
            jit_compile,
            xla.forward_name(s.index),
        )
        for s in stages
    )


def play_schedule(book: Playbook, x: tf.Tensor, ys: dict[str, tf.Tensor], base: tf.Tensor | None = None) -> Played:
    """The driver: every action of `plan.order` traced by its kind's handler, then the batch's loss."""
    state = _start(book, x, ys, base)
    for action in book.order:
        play_action(book, state, action)
    # The reported loss is what the chain minimizes: every stage's regularization included.
    device = book.stages[book.last].device
    reported = state.microbatch_losses + regularization_total(state.regs, book.stages, device)
    with tf.device(device):
        total = tf.add_n(reported)
    return Played(state.accumulated, total, state.previous)


def _start(book: Playbook, x: tf.Tensor, ys: dict[str, tf.Tensor], base: tf.Tensor | None) -> PlayState:
    """A play's state, with the batch and its labels cut into microbatches: each crosses to the first or
    last stage once and is cut on the device that consumes it."""
    stages, last = book.stages, book.last
    x0 = copy_to(x, stages[0].device, "input")
    y_last = copy_to(ys[book.target.name], stages[last].device, "labels")
    with tf.device(stages[0].device):
        xs = tf.split(x0, book.n_micro, name="microbatches") if tf.is_tensor(x0) else chunks_of(x0, book.n_micro)
    with tf.device(stages[last].device):
        labels = tf.split(y_last, book.n_micro, name="microbatch_labels")
        weights = book.loss_weights(labels) if book.loss_weights else None  # before any backward needs them
    rows = book.schedule.devices
    return PlayState(
        xs,
        labels,
        weights,
        base,
        book.options.progress is not None and base is not None,
        tf.compat.v1.get_default_graph(),
        accumulated=[None] * len(stages),
        previous=[[] for _ in range(rows)],
        regs=[[] for _ in stages],
        finished=[0] * rows,
    )


def play_action(book: Playbook, state: PlayState, action: Action) -> None:
    """One action: its handler's ops in its name scope, after its device row's previous action; then the
    op it ends with (the row's next action waits on it), its stall marker and its release."""
    device, row, options = book.stages[action.stage].device, book.schedule.row(action.stage), book.options
    first_op = len(state.graph.get_operations())
    held = testhooks.hold(action.scope(), state.previous[row], host())  # tests only: None unless asked
    if held is not None:
        state.previous[row] = [held]
    with tf.name_scope(action.scope()), tf.control_dependencies(state.previous[row]):
        done_ops = HANDLERS[book.kind(action)](book, state, action, first_op)  # None: every op of the action
        end = None
        if book.ordered or state.marked:
            ops = state.graph.get_operations()[first_op:] if done_ops is None else done_ops
            end = _done(ops, device) if book.ordered else _finished(ops, device)
        if book.ordered:
            state.previous[row] = [end]
    if state.marked:  # outside the action's scope: the marker's op is not the action's work in a trace
        state.finished[row] += 1
        options.progress.mark(
            state.base,
            options.replica * book.schedule.devices + row,
            state.finished[row],
            end,
            f"progress_{action.scope()}",
        )
    if book.ordered and action in book.released:
        state.previous[row] = [release(state.previous[row][0], action)]  # the send goes out before the stage goes on


def _taped(book: Playbook, state: PlayState, k: int, h: tf.Tensor, m: int, persistent: bool = False) -> Taped:
    """Stage k's forward on microbatch m from `h`, under a tape (`persistent`: a split backward asks it twice)."""
    with tf.GradientTape(persistent=persistent) as tape:
        if k > 0:
            tape.watch(differentiable(h))
        forward, share = book.forwards[k], 1.0 / book.n_micro
        if k != book.last:
            result = forward(h, share)
        elif state.loss_weights is None:
            result = forward(h, state.labels[m], share)
        else:  # its real labels' share of the batch's (`ignore_class`)
            result = forward(h, state.labels[m], share, state.loss_weights[m])
        kept = result[-1] if book.keeps[k] else None
        result = result[:-1] if book.keeps[k] else result
        if k == book.last:
            value, out = result
            return Taped(tape, out, value, None, kept)
        out, reg, scaled_reg = result
        return Taped(tape, out, reg, scaled_reg, kept)


def _forward(book: Playbook, state: PlayState, action: Action, first_op: int) -> None:
    """F(k, m): the activation from stage k-1 (stage 0: its microbatch), the forward, and what B needs."""
    k, m, s = action.stage, action.microbatch, book.stages[action.stage]
    h = state.xs[m] if k == 0 else copy_to(state.outputs.pop((k - 1, m)), s.device, activation_copy(k, m))
    with tf.device(s.device):
        if k == book.last and m in book.deferred:  # nothing runs yet: only the input is kept, and B runs it, once
            state.saved[(k, m)] = Waiting(h)
            state.loss_slot[m] = len(state.microbatch_losses)
            state.microbatch_losses.append(None)  # B's forward fills it
            return None
        if book.replayed(k, m):  # no tape kept: the intermediates die here; only `h` and the model's state stay
            saved = Replayable(h, snapshot(s.model))
            taped = _taped(book, state, k, h, m)
        else:
            taped = _taped(book, state, k, h, m, persistent=book.split)
            saved = Forwarded(h, taped)
        state.saved[(k, m)] = saved
    if k == book.last:
        state.microbatch_losses.append(taped.value)
    else:
        state.outputs[(k, m)] = taped.output
        if taped.value is not None:
            state.regs[k].append(taped.value)
    return None


def _output_gradient(book: Playbook, state: PlayState, k: int, m: int) -> tf.Tensor | None:
    """dL/d(output) of F(k, m), copied from stage k+1 (the last stage: None, it starts from its loss)."""
    if k == book.last:
        return None
    return copy_to(state.input_grads.pop((k + 1, m)), book.stages[k].device, gradient_copy(k, m))


def _retaped(book: Playbook, state: PlayState, saved: Forwarded | Replayable | Waiting, k: int, m: int) -> Taped:
    """The tape B(k, m) differentiates: F's, or the forward run now (deferred: its only run; recomputed:
    again, from its input, with the model's state as F found it)."""
    if isinstance(saved, Waiting):
        taped = _taped(book, state, k, saved.input, m)
        state.microbatch_losses[state.loss_slot.pop(m)] = taped.value
        return taped
    if isinstance(saved, Replayable):
        return replay(book.stages[k].model, saved.state, lambda: _taped(book, state, k, saved.input, m))
    return saved.taped


def _backward(book: Playbook, state: PlayState, action: Action, first_op: int) -> None:
    """B(k, m) of a schedule that does not split it: the input's and the weights' gradients, the latter
    added to stage k's sums (`first_op`: the action's first op, for `weights_first`)."""
    k, m, s = action.stage, action.microbatch, book.stages[action.stage]
    saved = state.saved.pop((k, m))
    g = _output_gradient(book, state, k, m)
    with tf.device(s.device):
        taped = _retaped(book, state, saved, k, m)
        ins = differentiable(saved.input) if k > 0 else []  # stage 0 needs no dL/dx
        sources = ins + s.gradient_variables
        targets, start = _seeds(taped.output, g, taped.scaled_reg)  # the stage's own term starts it too
        grads = taped.tape.gradient(targets, sources, output_gradients=start)
        if k > 0:
            state.input_grads[(k, m)] = input_gradient(saved.input, grads[: len(ins)])
        grads = grads[len(ins) :]
        if not book.options.jit_compile:  # compiled: one call op, nothing to order
            weights_first(grads, state.graph.get_operations()[first_op:])
        state.accumulated[k] = add_grads(state.accumulated[k], lend_back(book.stages, state.accumulated, k, grads))
    return None


def _input_gradient(book: Playbook, state: PlayState, action: Action, first_op: int) -> list[tf.Operation]:
    """B(k, m) of a split schedule: the input's gradient now, and the gradients at each kept output for W."""
    k, m, s = action.stage, action.microbatch, book.stages[action.stage]
    saved = state.saved.pop((k, m))  # a `Forwarded`: a split backward does not recompute
    g = _output_gradient(book, state, k, m)
    with tf.device(s.device):
        taped = saved.taped
        targets, start = _seeds(taped.output, g, taped.scaled_reg)
        ins = differentiable(saved.input) if k > 0 else []
        later = s.gradient_variables if book.whole[k] else [c.output for c in taped.kept or []]
        grads = taped.tape.gradient(targets, ins + later, output_gradients=start) if ins or later else []
        if k > 0:
            state.input_grads[(k, m)] = input_gradient(saved.input, grads[: len(ins)])
        if book.whole[k]:
            if not book.options.jit_compile:
                weights_first(grads[len(ins) :], state.graph.get_operations()[first_op:])
            state.halfway[(k, m)] = Halfway(targets, start, None, [], saved.input, list(grads[len(ins) :]))
        else:
            state.halfway[(k, m)] = Halfway(targets, start, taped.kept, grads[len(ins) :], saved.input)
    return [t.op for t in grads if t is not None]  # not the weights' products the tape builds too: W's, later


def _weight_gradient(book: Playbook, state: PlayState, action: Action, first_op: int) -> list[tf.Operation]:
    """W(k, m): the weights' gradients, from what B left, added to stage k's sums."""
    k, s = action.stage, book.stages[action.stage]
    half = state.halfway.pop((k, action.microbatch))
    with tf.device(s.device):
        grads = half.weights
        if grads is None:
            grads = weight_gradients(
                s, half.targets, half.start, half.kept, half.kept_grads, tf.nest.flatten(half.input)
            )
        state.accumulated[k] = add_grads(state.accumulated[k], lend_back(book.stages, state.accumulated, k, grads))
    done_ops = [t.op for t in grads if t is not None]  # not the side branches tf.gradients leaves
    return done_ops + summed_in_turn(state.accumulated[k], done_ops)  # and the sums: see `summed_in_turn`


# One handler per kind of action: (plan, state, action, the action's first op) -> the ops the stage's next
# action waits for (None: every op of the action).
HANDLERS: dict[str, Callable[[Playbook, PlayState, Action, int], list[tf.Operation] | None]] = {
    FORWARD: _forward,
    BACKWARD: _backward,
    INPUT_GRADIENT: _input_gradient,
    WEIGHT: _weight_gradient,
}


def finish(
    stages: Sequence[Stage],
    schedule: Schedule,
    updates: Sequence[Callable],
    played: Played,
    clip_global_norm: float | None = None,
    deferred: Deferred | Pooled | None = None,
    replica: int = 0,
) -> tf.Tensor:
    """Each stage's update from `played` (`updates[k]`: `stage_update`), after its row's last action,
    and the step's report on the last stage's device (see `e2e_step`); `replica`: the copy of the
    pipeline whose update this is (its scopes' names, `update_scope`)."""
    last = len(stages) - 1
    accumulated, total, previous = played.grads, played.total, played.previous
    grads, scopes = [], []
    for s in stages:  # the update is each stage's last action
        with (
            tf.name_scope(update_scope(s.index, replica)) as scope,
            tf.device(s.device),
            tf.control_dependencies(previous[schedule.row(s.index)]),
        ):
            grads.append(unscale(s, accumulated[s.index]))
            if deferred:  # the moving statistics' one update, from every microbatch of the step
                deferred.update(s)
        scopes.append(scope)
    grads = sum_shared(stages, grads)  # a weight several stages hold: every copy gets the summed gradient
    outcomes = shared_outcomes(stages, grads, total, stages[last].device)  # float16 only
    norm, verdicts = None, [None] * len(stages)
    if clip_global_norm is not None:  # after unscaling and the overflow decision, before the updates
        clipped = clip_global(stages, grads, clip_global_norm, stages[last].device, later_copies(stages))
        grads, norm, verdicts = clipped.grads, clipped.norm, clipped.finite  # the norm is the guard's verdict
    values = []
    for s, g, outcome, verdict, scope in zip(stages, grads, outcomes, verdicts, scopes):
        # `scope` ends in "/": the same name scope again, not a new `s{k}_update_1`.
        with tf.name_scope(scope), tf.device(s.device), tf.control_dependencies(previous[schedule.row(s.index)]):
            values.append([dropped(updates[s.index](g, None, outcome, verdict))])
    values[last].append(total)
    if norm is not None:
        values[last].append(norm)
    return report(stages, values, stages[last].device)
