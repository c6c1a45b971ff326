"""mode=e2e: the chain as one network, trained by a pipeline schedule in one `tf.function`.

The batch is cut into M equal microbatches. Every action of the schedule becomes ops
inside its stage's device scope:

- F(k, m): copy microbatch m's activation from stage k-1 (stage 0: its slice of the
  input) onto stage k's device, run stage k's model under a GradientTape. The last
  stage also computes the loss of microbatch m, divided by M so that the sum over
  microbatches is the full-batch mean loss. Every stage adds its model's regularization
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
the next stage idled through the whole fill (measured with TensorFlow's profiler on two
workers: efficiency 0.66 without releases, 0.86 with them, docs/benchmarks.md). The
release stops the chain after each such action; the queued send goes out while the round
trip to the host (a fraction of a millisecond) lets the stage go on. The order of each
stage's actions, and so 1F1B's bound, is unchanged: the release only adds a wait.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Callable, Sequence

import tensorflow as tf

from chain import testhooks
from chain.data.catalog import Target
from chain.internals.tf_private import add_control_input, host_address_space
from chain.pipeline.progress import Progress
from chain.pipeline.schedules import (BACKWARD, DONE, FORWARD, WEIGHT, Action, Schedule, backward_at_once, is_split,
                                      rounds, simulate, update_scope)
from chain.planning.devices import canonical
from chain.stages.stage import Stage
from chain.steps import xla
from chain.steps.clipping import clip_global
from chain.steps.deferred_norm import Deferred, Pooled
from chain.steps.forward import Kept, chain_forward, layer_by_layer
from chain.steps.ops import add_grads, copy_to
from chain.steps.recompute import NEVER, recomputed, replay, snapshot
from chain.steps.report import dropped, report
from chain.steps.tied import repeated, sum_shared
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
        ends = [tf.identity(t).op if t.dtype not in (tf.resource, tf.variant) else op
                for op in last for t in op.outputs[:1]] + [op for op in last if not op.outputs]
        return tf.group(*ends, name=DONE)


def host() -> str:
    """This process's CPU, fully named (`/job:localhost/replica:0/task:0/device:CPU:0`); in a
    cluster, the client's. (A partial `/device:CPU:0` leaves the job and task to the placer,
    which may pick a worker's CPU, a stage's own included.)"""
    return host_address_space() + "/device:CPU:0"


def sends(action: Action, devices: Sequence[str]) -> bool:
    """Whether `action`'s result goes to another device: a forward's activation to stage k+1,
    a backward's input gradient to stage k-1 (the last forward and the first backward send
    nothing, nor does an action whose neighbour shares its device)."""
    k, kind = action.stage, action.kind
    if kind == WEIGHT:
        return False  # W's gradients stay on the stage
    to = k + 1 if kind == FORWARD else k - 1
    return 0 <= to < len(devices) and canonical(devices[k]) != canonical(devices[to])


def release_name(action: Action) -> str:
    """The name of the host op that lets a stage go on after `action` (`release_s0_F1`)."""
    return f"release_{action.scope()}"


def _release(done: tf.Operation, action: Action) -> tf.Operation:
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
    runs = [a.microbatch for a in mine
            if a.kind == (BACKWARD if a.microbatch in waiting else FORWARD) and a.kind != WEIGHT]
    return frozenset(waiting) if runs == forwards else frozenset()


def weight_gradients(stage: Stage, targets, start, kept: Sequence[Kept] | None,
                     kept_grads: Sequence[tf.Tensor | None]) -> list[tf.Tensor | None]:
    """W of a split backward: the gradients of `stage`'s trainable variables (in their order).

    With every weighted layer's call kept (`kept`: its inputs and output, and `kept_grads`, the
    gradients B computed at those outputs), each call gives the weights it reads their gradient from
    its own output's, differentiated back to its inputs only: only that layer's backward runs again
    (its activation's derivative, elementwise, and the weight products), not the whole stage's. A
    weight read by several calls (tied) sums what each gives. What reaches the weights otherwise (a
    kernel regularizer's term in `targets`) is added with the kept outputs held fixed. Without them
    (a model `layer_by_layer` refuses, or XLA), the whole backward runs again from `targets`
    (`start`: their output gradients). `tf.gradients` names its ops in the current scope
    (`s{k}_W{m}/gradients/...`), so a trace reads them back as W."""
    variables = stage.trainable_variables
    handles = [v.value if hasattr(v, "value") else v for v in variables]  # Keras 3 wraps the tf.Variable
    if kept is None:
        return tf.gradients(targets, handles, grad_ys=start)
    total: list[tf.Tensor | None] = list(tf.gradients(targets, handles, grad_ys=start,
                                                      stop_gradients=[c.output for c in kept]))
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
    GPipe `always` shows (`chain.pipeline.memory_trace`, docs/benchmarks.md: 5-6 layers' gradients
    per stage at the peak). With the edges a backward holds about one layer's gradient at a time.
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
        later = list(dict.fromkeys(c for t in gradients for c in t.consumers()
                                   if c is not w and c in mine and w not in c.control_inputs and c not in products))
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
    gradients: each W's weight gradients then stay alive until the stage's last W (the memory trace
    of zb1 found 16 microbatches' worth, 33 MiB, at its peak; docs/benchmarks.md). The results were
    bit for bit those of the folded sum in every case checked (`tests/test_pipeline.py`, and zb1
    with dropout and Adam at M = 2 and 4)."""
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


def e2e_step(stages: Sequence[Stage], schedule: Schedule, loss: Callable, target: Target,
             grad_accum: int = 1, jit_compile: bool = False, ordered: bool | None = None, release: bool = True,
             clip_global_norm: float | None = None, batch_norm: str = "microbatch", recompute_policy: str = NEVER,
             weights_early: bool = True, progress: Progress | None = None) -> Callable:
    """The training step of `schedule` over `stages`, traceable: `step(x, ys) -> report` (each
    stage's guard flag, then the mean batch loss and, with `clip_global_norm`, the global
    gradient norm: `Layout.chain`).

    `loss(y, pred)` is the mean loss of one microbatch; `target` names the entry of
    `ys` that the last stage learns. `grad_accum` rounds of the schedule make one
    update; `jit_compile` compiles each stage's forward (with its gradient) and update
    with XLA (`chain.steps.xla`). `ordered=False` leaves out the control dependencies that
    hold each stage to the schedule's order (an ablation for benchmarks: the executor then
    runs every op as soon as its inputs are ready); `release=False` leaves out the host
    releases after sending actions (an ablation: the step as it was before them).
    `clip_global_norm=C` clips the accumulated, unscaled gradients of every stage by their
    global norm (`chain.steps.clipping`, computed on the last stage's device).
    `batch_norm="deferred"` updates every BatchNormalization layer's moving statistics once,
    from the whole batch, in each stage's update (`chain.steps.deferred_norm`).
    `recompute_policy` (`pipeline.recompute`): which microbatches keep only their input and run
    their forward again in their backward (`chain.steps.recompute`). `weights_early=False` leaves out
    the edges that make a backward compute each layer's weight gradients before going on past it
    (`weights_first`) and a W's stage wait for its gradient sums (`summed_in_turn`): an ablation,
    the step as it was before them, with the same values and more memory held.
    `progress` (`trainer.stall_s`): the host's markers each action updates when it is done
    (`chain.pipeline.progress`), so a stalled step can say where it waits.
    """
    play = e2e_play(stages, schedule, loss, target, grad_accum, jit_compile, ordered, release, recompute_policy,
                    weights_early=weights_early, progress=progress)
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


def e2e_play(stages: Sequence[Stage], schedule: Schedule, loss: Callable, target: Target,
             grad_accum: int = 1, jit_compile: bool = False, ordered: bool | None = None, release: bool = True,
             recompute_policy: str = NEVER, replica: int = 0, weights_early: bool = True,
             progress: Progress | None = None) -> Callable:
    """`play(x, ys, base) -> Played`: `e2e_step` up to the update (its arguments), traceable; a replicated
    pipeline (`chain.pipeline.replicas`) plays it once per copy (`replica`: its actions' scopes say
    which, `Action.scope`) and averages the gradients over the copies first. With `progress`, `base`
    (`Progress.begin`'s, once per step) starts the values of the markers each action sets when done."""
    if schedule.stages != len(stages):
        raise ValueError(f"schedule for {schedule.stages} stages, chain has {len(stages)}")
    if recompute_policy != NEVER and is_split(schedule):
        raise ValueError(f"{schedule.name}: a split backward (B and W) does not recompute (recompute_policy=NEVER)")
    for r in range(schedule.devices):  # a row's order is one device's: its stages must share that device
        if len({canonical(stages[k].device) for k in schedule.row_stages(r)}) > 1:
            raise ValueError(f"{schedule.name}: stages {schedule.row_stages(r)} share a row of the schedule but not a device")
    order = rounds(simulate(schedule).order(), schedule.microbatches, grad_accum, replica)  # simulate validates
    at_once = backward_at_once(schedule)  # kept under every policy: a replay would hold the same, at once

    def replayed(k: int, m: int) -> bool:
        """Whether F(k, m) keeps only its input and B(k, m) runs it again (`m` over all rounds)."""
        within = m % schedule.microbatches
        return recomputed(recompute_policy, within, schedule.microbatches) and (k, within) not in at_once

    n_stages, n_micro = len(stages), schedule.microbatches * grad_accum
    # With one microbatch a stage has one forward and one backward, which its data already
    # orders (the backward reads the forward's tape): the chaining would bound nothing and only
    # make each action wait for the previous one's side branches, and the releases exist only to
    # break that chain. Leaving both out changes no value (stateful ops stay in trace order).
    ordered = n_micro > 1 if ordered is None else ordered
    devices = [s.device for s in stages]
    last = n_stages - 1
    deferred = deferred_forwards(order, last, replayed)  # the last stage's forwards that run once, in B
    split = is_split(schedule)
    # A split backward keeps every layer's output where the model allows it (not under XLA, whose
    # compiled forward shows none of them): W then starts from the gradients B left there.
    keeps = [split and not jit_compile and layer_by_layer(s) for s in stages]
    forwards = [xla.stage_function(chain_forward(s, loss if s.index == last else None, keeps[s.index]), jit_compile,
                                   xla.forward_name(s.index)) for s in stages]
    def play(x: tf.Tensor, ys: dict[str, tf.Tensor], base: tf.Tensor | None = None) -> Played:
        # The batch and its labels cross to the first and last stage once; each is cut
        # into microbatches on the device that consumes it.
        x0 = copy_to(x, stages[0].device, "input")
        y_last = copy_to(ys[target.name], stages[last].device, "labels")
        with tf.device(stages[0].device):
            xs = tf.split(x0, n_micro, name="microbatches")
        with tf.device(stages[last].device):
            labels = tf.split(y_last, n_micro, name="microbatch_labels")

        saved: dict[tuple[int, int], tuple] = {}  # (k, m) -> (tape, input, output or loss, reg, kept outputs);
        seeds: dict[tuple[int, int], tuple] = {}  # split: (k, m) -> what the backward starts from (B to W)
        kept_grads: dict[tuple[int, int], list] = {}  # split: (k, m) -> gradients at the kept outputs
        # recomputed: (None, input, the model's state before the forward, None, None)

        def taped(k: int, h: tf.Tensor, m: int, persistent: bool = False) -> tuple:
            """Stage k's forward on microbatch m under a tape that watches `h`: (tape, what its backward
            differentiates: the output, or the last stage's scaled loss; the value reported: the last
            stage's loss, else its weighted regularization or None; the scaled regularization the
            backward starts from too, or None; the kept layer outputs, or None)."""
            with tf.GradientTape(persistent=persistent) as tape:  # a split backward asks it twice
                if k > 0:
                    tape.watch(h)
                result = forwards[k](h, labels[m], 1.0 / n_micro) if k == last else forwards[k](h, 1.0 / n_micro)
                kept = result[-1] if keeps[k] else None
                result = result[:-1] if keeps[k] else result
                if k == last:
                    value, out = result
                    return tape, out, value, None, kept
                out, reg, scaled_reg = result
                return tape, out, reg, scaled_reg, kept

        outputs: dict[tuple[int, int], tf.Tensor] = {}  # forward results waiting for stage k+1
        input_grads: dict[tuple[int, int], tf.Tensor] = {}  # dL/dinput waiting for stage k-1
        accumulated: list[list | None] = [None] * n_stages
        previous: list[list[tf.Operation]] = [[] for _ in range(schedule.devices)]  # each device's last action's `done`
        microbatch_losses: list[tf.Tensor | None] = []  # the last stage's, in the order of its forwards
        loss_slot: dict[int, int] = {}  # a deferred forward's microbatch -> its place in microbatch_losses
        regs: list[list[tf.Tensor]] = [[] for _ in stages]  # stages before the last: weighted regularization
        graph = tf.compat.v1.get_default_graph()
        marked = progress is not None and base is not None
        finished = [0] * schedule.devices  # each row's actions traced so far: its marker's count after the next

        for action in order:
            k, m, kind = action.stage, action.microbatch, action.kind
            s = stages[k]
            first_op = len(graph.get_operations())
            done_ops = None  # the ops the stage's next action waits for (None: every op of this one)
            row = schedule.row(k)  # the device whose order this action follows (interleaved: shared by stages)
            held = testhooks.hold(action.scope(), previous[row], host())  # tests only: None unless asked
            if held is not None:
                previous[row] = [held]
            with tf.name_scope(action.scope()), tf.control_dependencies(previous[row]):
                if kind == FORWARD:
                    h = xs[m] if k == 0 else copy_to(outputs.pop((k - 1, m)), s.device, activation_copy(k, m))
                    with tf.device(s.device):
                        if k == last and m in deferred:
                            # Nothing runs yet: only the input is kept, and B runs the forward, once.
                            saved[(k, m)] = (None, h, None, None, None)
                        elif replayed(k, m):
                            # No tape kept: the intermediates die here; only `h` and the model's state stay.
                            state = snapshot(s.model)
                            _, out, value, _, _ = taped(k, h, m)
                            saved[(k, m)] = (None, h, state, None, None)
                        else:
                            tape, out, value, scaled_reg, kept = taped(k, h, m, persistent=split)
                            saved[(k, m)] = (tape, h, out, scaled_reg, kept)
                    if k == last and m in deferred:
                        loss_slot[m] = len(microbatch_losses)
                        microbatch_losses.append(None)  # B's forward fills it
                    elif k == last:
                        microbatch_losses.append(value)
                    else:
                        outputs[(k, m)] = out
                        if value is not None:
                            regs[k].append(value)
                elif kind == BACKWARD and not split:
                    tape, h, out, scaled_reg, _ = saved.pop((k, m))
                    g = None if k == last else copy_to(input_grads.pop((k + 1, m)), s.device, gradient_copy(k, m))
                    with tf.device(s.device):
                        if tape is None and k == last and m in deferred:  # the forward now, its only run
                            tape, out, value, scaled_reg, _ = taped(k, h, m)
                            microbatch_losses[loss_slot.pop(m)] = value
                        elif tape is None:  # recomputed: the forward again, from its input, with its state
                            tape, out, _, scaled_reg, _ = replay(s.model, out, lambda: taped(k, h, m))
                        variables = s.trainable_variables
                        sources = ([h] if k > 0 else []) + variables  # stage 0 needs no dL/dx
                        targets, start = _seeds(out, g, scaled_reg)  # the stage's own term starts it too
                        grads = tape.gradient(targets, sources, output_gradients=start)
                        if k > 0:
                            input_grads[(k, m)] = grads[0]
                            grads = grads[1:]
                        if weights_early and not jit_compile:  # compiled: one call op, no products to order
                            weights_first(grads, graph.get_operations()[first_op:])
                        accumulated[k] = add_grads(accumulated[k], grads)
                elif kind == BACKWARD:  # split: the input's gradient now, and the gradients at each kept output
                    tape, h, out, scaled_reg, kept = saved[(k, m)]
                    g = None if k == last else copy_to(input_grads.pop((k + 1, m)), s.device, gradient_copy(k, m))
                    with tf.device(s.device):
                        targets, start = seeds[(k, m)] = _seeds(out, g, scaled_reg)
                        sources = ([h] if k > 0 else []) + [c.output for c in kept or []]
                        grads = tape.gradient(targets, sources, output_gradients=start) if sources else []
                        if k > 0:
                            input_grads[(k, m)] = grads[0]
                        done_ops = [g.op for g in grads if g is not None]  # not the weights' products the
                        kept_grads[(k, m)] = grads[1:] if k > 0 else grads  # tape builds too: W's, later
                else:  # W: the weights' gradients, from what B left
                    _, _, _, _, kept = saved.pop((k, m))
                    targets, start = seeds.pop((k, m))
                    with tf.device(s.device):
                        grads = weight_gradients(s, targets, start, kept, kept_grads.pop((k, m)))
                        accumulated[k] = add_grads(accumulated[k], grads)
                    done_ops = [g.op for g in grads if g is not None]  # not the side branches tf.gradients leaves
                    if weights_early:  # and the sums: see `summed_in_turn`
                        done_ops += summed_in_turn(accumulated[k], done_ops)
                end = None
                if ordered or marked:
                    ops = graph.get_operations()[first_op:] if done_ops is None else done_ops
                    end = _done(ops, s.device) if ordered else _finished(ops, s.device)
                if ordered:
                    previous[row] = [end]
            if marked:  # outside the action's scope: a host op, not the action's work in a trace
                finished[row] += 1
                progress.mark(base, replica * schedule.devices + row, finished[row], end, f"progress_{action.scope()}")
            if ordered and release and sends(action, devices):  # let the send go out before the stage goes on
                previous[row] = [_release(previous[row][0], action)]

        # The reported loss is what the chain minimizes: every stage's regularization included.
        reported = microbatch_losses + regularization_total(regs, stages, stages[last].device)
        with tf.device(stages[last].device):
            total = tf.add_n(reported)
        return Played(accumulated, total, previous)

    return play


def finish(stages: Sequence[Stage], schedule: Schedule, updates: Sequence[Callable], played: Played,
           clip_global_norm: float | None = None, deferred: Deferred | Pooled | None = None, replica: int = 0
           ) -> tf.Tensor:
    """Each stage's update from `played` (`updates[k]`: `stage_update`), after its row's last action,
    and the step's report on the last stage's device (see `e2e_step`); `replica`: the copy of the
    pipeline whose update this is (its scopes' names, `update_scope`)."""
    last = len(stages) - 1
    accumulated, total, previous = played.grads, played.total, played.previous
    grads, scopes = [], []
    for s in stages:  # the update is each stage's last action
        with tf.name_scope(update_scope(s.index, replica)) as scope, tf.device(s.device), \
                tf.control_dependencies(previous[schedule.row(s.index)]):
            grads.append(unscale(s, accumulated[s.index]))
            if deferred:  # the moving statistics' one update, from every microbatch of the step
                deferred.update(s)
        scopes.append(scope)
    grads = sum_shared(stages, grads)  # a weight several stages hold: every copy gets the summed gradient
    outcomes = shared_outcomes(stages, grads, total, stages[last].device)  # float16 only
    norm = None
    if clip_global_norm is not None:  # after unscaling and the overflow decision, before the updates
        grads, norm = clip_global(stages, grads, clip_global_norm, stages[last].device, repeated(stages))
    values = []
    for s, g, outcome, scope in zip(stages, grads, outcomes, scopes):
        # `scope` ends in "/": the same name scope again, not a new `s{k}_update_1`.
        with tf.name_scope(scope), tf.device(s.device), tf.control_dependencies(previous[schedule.row(s.index)]):
            values.append([dropped(updates[s.index](g, None, outcome))])
    values[last].append(total)
    if norm is not None:
        values[last].append(norm)
    return report(stages, values, stages[last].device)
