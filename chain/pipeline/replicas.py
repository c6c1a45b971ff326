"""`Replicated`: R copies of the K-stage pipeline (`placement.replicas=R`), data parallel.

The planner places replica r's stage k on its own device (`Assignment.copies[r][k]`). One compiled
step cuts each batch into R equal shares, and every copy plays the schedule on its share
(`chain.pipeline.play.e2e_play`: its microbatches, grad_accum rounds, float16 loss scaling).
Before the update, stage k's summed gradients are reduced over its R copies: each copy's
device receives the other copies' gradients (explicit copies, as every crossing in the step)
and adds all R in replica order, then divides by R (each copy's gradients are of its share's
mean loss; with `placement.exchange_dtype=bfloat16` they travel rounded to 16 bits). Every device thus computes the same sums in the same order, bit for bit, and every
copy applies the same update (`chain.pipeline.play.finish`, with the batch's mean loss for
float16's shared decision): the copies stay identical without ever being compared. A cut model's tied
weight (held by the first and last stage, `chain.steps.tied`) is summed within each copy on its first
holder's device before the reduction, so its gradient is averaged once, and every holder of every copy
applies that mean: one value per holder and copy, all equal. With
`optim.clip_global_norm` each copy clips by the norm of the averaged gradients (the same bits on
every copy, computed after the reduction); with `pipeline.batch_norm=deferred` each copy's moving
statistics take one update from every copy's microbatches (`chain.steps.deferred_norm.Pooled`).
Copy r names its actions' scopes `Action(..., replica=r).scope()` (`r1_s0_F0`), so a trace of the
step shows every copy (`chain.pipeline.timeline`). Interleaved stages and schedule files whose
rows hold several stages loop over each copy's own devices (`placement.copies`).

Checkpoints, exports and evaluation see replica 0's stages only (`self.stages`): one copy of
each stage, so a run resumes with another R. After a restore (`restored`), and once when built,
replica 0's state (weights, optimizer slots, loss scales, counters, dropout seeds) is copied
into every other copy.
"""

from __future__ import annotations

import contextlib
from dataclasses import replace
from typing import Any, Callable, Sequence

import tensorflow as tf

from chain.config.checks import BatchCut
from chain.config.schema import Settings
from chain.data.catalog import DataInfo
from chain.errors import ConfigError
from chain.schedule.schedules import Schedule
from chain.pipeline.stalled import Position, where
from chain.pipeline.play import Played, e2e_play, finish, host
from chain.pipeline.strategy import Scheduled
from chain.planning.planner import REPLICATED, Assignment
from chain.records.summaries import ReplicasFields, Summary
from chain.stages.losses import ShareOfBatch, WholeBatch
from chain.stages.stage import Stage
from chain.steps.deferred_norm import Deferred, Pooled
from chain.steps.ops import chunks_of, copy_to
from chain.steps.tied import gather_shared
from chain.steps.update import stage_update
from chain.strategies.objectives import ChainObjective


def stage_state(stage: Stage) -> list[tf.Variable]:
    """Every variable that makes a stage what it is: weights (with dropout seeds), the optimizer's
    state, the numerics guard's count and the loss scale; in an order the same for every copy."""
    head = stage.head.variables if stage.head is not None else []
    out = list(stage.model.variables) + list(head) + list(stage.optimizer.variables) + [stage.skipped]
    if stage.loss_scale is not None:
        ls = stage.loss_scale
        out += [ls.scale, ls.good_steps, ls.overflows]
    return out


def reduce_mean(
    values: Sequence[tf.Tensor | None],
    devices: Sequence[str],
    name: str,
    owner: int | None = None,
    travel: tf.DType | None = None,
) -> list[tf.Tensor | None]:
    """`values[r]` (on `devices[r]`) averaged over r, on every device, the same bits everywhere: the
    R values added in replica order, then times 1/R.

    `owner=None`: every device receives the others' values and adds all R itself (R(R-1) copies,
    R sums). `owner=o`: device o alone receives and adds them, and sends the mean back (2(R-1)
    copies, one sum; the same bits, as o's sum is the one every device would compute, one hop more).

    `travel` (`placement.exchange_dtype=bfloat16`): each value is rounded to that dtype on its own
    device before it travels (half the bytes of float32), and every device adds the rounded values,
    its own included, in the values' dtype: still the same bits on every device, but each copy's
    values rounded to 8 significant bits (an owner's mean is rounded for its trip back as well).

    An embedding's sparse gradients (IndexedSlices in every copy) are averaged by joining their rows
    (`joined_mean`), not made dense."""
    if values[0] is None:
        return [None] * len(values)
    if all(isinstance(v, tf.IndexedSlices) for v in values):
        return joined_mean(values, devices, name, travel)
    values = [tf.convert_to_tensor(v) for v in values]  # a sparse gradient beside a dense one: made dense
    dtype, n = values[0].dtype, len(values)
    rounded = travel is not None and travel != dtype

    def cast(t: tf.Tensor, device: str, to: tf.DType) -> tf.Tensor:  # on `device`; nothing without `travel`
        if not rounded:
            return t
        with tf.device(device):
            return tf.cast(t, to)

    sent = [cast(v, device, travel) for v, device in zip(values, devices)]

    def arrived(i: int, r: int) -> tf.Tensor:  # value i as device r adds it
        moved = sent[i] if i == r else copy_to(sent[i], devices[r], f"{name}_from_r{i}_to_r{r}")
        return cast(moved, devices[r], dtype)

    if owner is not None:
        parts = [arrived(i, owner) for i in range(n)]
        with tf.device(devices[owner]):
            mean = cast(tf.add_n(parts) * (1.0 / n), devices[owner], travel)
        return [
            cast(mean if r == owner else copy_to(mean, device, f"{name}_mean_to_r{r}"), device, dtype)
            for r, device in enumerate(devices)
        ]
    out = []
    for r, device in enumerate(devices):
        parts = [arrived(i, r) for i in range(n)]
        with tf.device(device):
            out.append(tf.add_n(parts) * (1.0 / n))
    return out


def joined_mean(
    values: Sequence[tf.IndexedSlices], devices: Sequence[str], name: str, travel: tf.DType | None = None
) -> list[tf.IndexedSlices]:
    """The copies' sparse gradients (`values[r]` on `devices[r]`) averaged on every device by joining their rows
    in replica order, each row times 1/R: the whole batch's sparse gradient row for row, as one device has it
    (microbatches' rows are joined so too, `chain.steps.ops.add_grads`). Made dense, Keras' Adam would update it
    otherwise and the global norm would count a token's rows summed, not each (`chain.steps.clipping`).
    `travel`: each copy's rows rounded to it before they travel, as `reduce_mean`'s values are."""
    n, sent = len(values), []
    for v, device in zip(values, devices):  # each copy's rows as they travel, rounded once on their own device
        with tf.device(device):
            sent.append(v.values if travel is None or travel == v.values.dtype else tf.cast(v.values, travel))
    out = []
    for r, device in enumerate(devices):
        rows = [x if i == r else copy_to(x, device, f"{name}_rows_from_r{i}_to_r{r}") for i, x in enumerate(sent)]
        ids = [
            v.indices if i == r else copy_to(v.indices, device, f"{name}_ids_from_r{i}_to_r{r}")
            for i, v in enumerate(values)
        ]
        with tf.device(device):
            joined = tf.concat([tf.cast(x, values[r].values.dtype) for x in rows], 0)
            out.append(tf.IndexedSlices(joined * (1.0 / n), tf.concat(ids, 0), values[r].dense_shape))
    return out


def owners(sizes: Sequence[int], replicas: int) -> list[int]:
    """For `reduction="owner"`: which copy sums each of a stage's gradients (on that copy's device for
    the stage), given their sizes (elements) in the step's order: each goes to the copy that owns the
    fewest elements so far (the lowest index on a tie), so every copy sums about 1/R of the bytes.
    (Owner (k + j) mod R, as before, put every kernel of a one-stage model on copy 0 and every bias
    on copy 1: copy 0 did all the sums.)"""
    load, out = [0] * replicas, []
    for size in sizes:
        r = min(range(replicas), key=lambda i: (load[i], i))
        load[r] += size
        out.append(r)
    return out


def elements(t: Any) -> int:
    """A gradient's number of elements from its static shape (1 when unknown, or no gradient)."""
    shape = getattr(t, "shape", None)
    if shape is None or not shape.is_fully_defined():
        return 1
    return max(1, shape.num_elements())


class Replicated(Scheduled):
    """`Assignment.copies`: R copies of the scheduled pipeline, each its share of every batch (with the
    chain's objective, mode=e2e: ReplicatedChain)."""

    name = REPLICATED
    title = "Replicated"
    # How stage k's j-th gradient is averaged (`reduce_mean`): "every" device sums all copies, or one
    # "owner" copy (`owners`: each copy about 1/R of the bytes) sums and sends the mean back. The same
    # bits either way; a benchmark's choice (scripts/bench_pipeline.py --replicas --decompose), read
    # when the step is traced.
    reduction = "every"

    def __init__(
        self,
        settings: Settings,
        assignment: Assignment,
        info: DataInfo,
        batch_cut: BatchCut,
        learns: type[ChainObjective],
        schedule: Schedule,
        **bodies: Any,
    ):
        self.copies: list[list[Stage]] = []
        super().__init__(settings, assignment, info, batch_cut, learns, schedule, **bodies)

    def build_stages(self) -> list[Stage]:
        """Replica 0's stages (`self.stages`: what checkpoints hold), then every other copy's on its
        devices, each built from the same seed and then set to replica 0's state."""
        first = super().build_stages()
        s = self.settings
        self.copies = [first]
        for row in self.assignment.copies[1:]:
            self.copies.append(self.build_copy(row))
        for copy in self.copies[1:]:
            for a, b in zip(first, copy):
                if {id(v) for v in a.model.variables} & {id(v) for v in b.model.variables}:
                    raise ConfigError(
                        f"placement.replicas={s.placement.replicas}: stage {a.index}'s body returns the "
                        "same model each time it is built, so its copies would share one set of weights; "
                        "give a function that builds a new model, or remove placement.replicas"
                    )
        self.sync()
        return first

    def sync(self) -> None:
        """Copy replica 0's state into every other copy (eagerly, once: not per step)."""
        for copy in self.copies[1:]:
            for a, b in zip(self.copies[0], copy):
                for va, vb in zip(stage_state(a), stage_state(b), strict=True):
                    vb.assign(va)

    def restored(self) -> None:
        self.sync()

    def make_step(self) -> Callable:
        t = self.settings.trainer
        loss, whole = self.loss_fn(), WholeBatch()
        if loss.ignore_class is not None:  # each copy's microbatches weighed against the whole batch's real labels
            loss = ShareOfBatch(loss, self.batch_cut.replicas, whole)
        self.progress = progress = self.markers(self.copies)
        plays = [
            e2e_play(
                stages,
                self.schedule,
                loss,
                self.target,
                t.grad_accum,
                t.jit_compile,
                recompute_policy=self.settings.pipeline.recompute,
                replica=r,
                progress=progress,
                batch_cut=self.batch_cut,
            )
            for r, stages in enumerate(self.copies)
        ]
        updates = [[stage_update(s, t.jit_compile) for s in stages] for stages in self.copies]
        copies, n = self.copies, self.batch_cut.replicas  # a share of every batch per copy
        exchange = self.settings.placement.exchange_dtype
        travel = None if exchange == "float32" else tf.as_dtype(exchange)
        deferred = [Deferred(stages) for stages in copies] if self.settings.pipeline.batch_norm == "deferred" else None

        def step(x: tf.Tensor, ys: dict[str, tf.Tensor]) -> tf.Tensor:
            with contextlib.ExitStack() as recording:  # pipeline.batch_norm=deferred: every copy's moments
                for d in deferred or []:
                    recording.enter_context(d.recording())
                return replicated(x, ys)

        def replicated(x: tf.Tensor, ys: dict[str, tf.Tensor]) -> tf.Tensor:
            with tf.device(host()):  # each share crosses to its copy's first (and last) stage from here
                xs = chunks_of(x, n)  # a dict of inputs (keras_hub's) cut leaf by leaf
                shares = {key: tf.split(y, n, name=f"replica_{key}") for key, y in ys.items()}
                if isinstance(loss, ShareOfBatch):
                    whole.real = loss.loss.real(ys[self.target.name])
            base = progress.begin([x]) if progress else None  # once per step, for every copy's markers
            played = [play(xs[r], {key: v[r] for key, v in shares.items()}, base) for r, play in enumerate(plays)]
            # A tied weight's gradients summed within each copy first: its mean crosses the copies once.
            grads = [gather_shared(copies[r], p.grads) for r, p in enumerate(played)]
            per_replica: list[list[list]] = [[[] for _ in copies[0]] for _ in copies]
            for k in range(len(copies[0])):
                devices = [c[k].device for c in copies]
                owned = owners([elements(g) for g in grads[0][k]], n)  # per stage: its R devices
                for j in range(len(grads[0][k])):
                    owner = owned[j] if self.reduction == "owner" else None
                    mean = reduce_mean([g[k][j] for g in grads], devices, f"allreduce_s{k}_g{j}", owner, travel)
                    for r in range(n):
                        per_replica[r][k].append(mean[r])
            totals = reduce_mean([p.total for p in played], [c[-1].device for c in copies], "allreduce_loss")
            # Every copy clips by the norm of the averaged gradients (the same on every copy, computed
            # after the reduction) and updates its batch norms' statistics from every copy's microbatches.
            reports = [
                finish(
                    copies[r],
                    self.schedule,
                    updates[r],
                    Played(per_replica[r], totals[r], played[r].previous),
                    self.clip_global_norm,
                    Pooled(deferred, r) if deferred else None,
                    replica=r,
                )
                for r in range(n)
            ]
            with tf.device(copies[0][-1].device), tf.control_dependencies(reports[1:]):
                return tf.identity(reports[0])  # every copy's update runs, replica 0 reports

        return step

    def cut_description(self) -> str:
        return f"{self.batch_cut.replicas} replicas' shares (placement.replicas), each {super().cut_description()}"

    def memory_devices(self) -> list[str]:
        return [s.device for copy in self.copies for s in copy]

    def waiting(self, position: Position) -> list[str]:
        return where(
            self.schedule, self.settings.trainer.grad_accum, self.memory_devices(), position, self.batch_cut.replicas
        )

    def summary(self, summary: Summary) -> Summary:
        copies = ReplicasFields(self.batch_cut.replicas, [list(row) for row in self.assignment.copies])
        return replace(super().summary(summary), replicas=copies)

    def plan_text(self, full: bool) -> str:
        r = self.batch_cut.replicas
        return (
            f"{r} copies of the pipeline (the grid above), each playing this schedule on its "
            f"1/{r} of every batch:\n{super().plan_text(full)}"
        )
