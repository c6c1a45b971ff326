"""Mirrored strategies: the whole chain on every replica, trained data-parallel.

With fewer cards than stages and a chain that fits one card, `placement.fallback=mirrored`
builds every stage under a `tf.distribute.MirroredStrategy` (each variable and optimizer
slot then has a copy on every replica device) and trains in a custom loop: each replica
runs the composed chain on its share of the global batch (`data.batch_size`), scales
each stage's loss by that share so that the sum over replicas is the global-batch mean,
and returns its gradients (`chain.steps.replica`). The step sums them over replicas and
applies each stage's update once, in cross-replica context: the numerics guard wraps
every update in a `tf.cond`, and an all-reduce (a synchronisation point) may not sit
inside one.

With `LocalObjective` it keeps mode=local's meaning on every replica: each stage its own head,
loss and optimizer, the gradient stopped between stages. With `ChainObjective` (mode=e2e) it runs
the composed chain with one loss after the last stage (the objective gives the replica's step,
the float16 decision and the clipping: `replica_step`, `outcomes`, `clip`); a cut model's tied weight
(a copy on every stage holding it, each mirrored) takes the sum of its holders' all-reduced gradients
on every holder, the global norm counting it once. In both, one mirrored step
computes the same losses and the same update as one pipelined step on the same global
batch (for e2e: any schedule, any number of microbatches).

The switches: with `trainer.grad_accum=N` the global batch of a step is N x
`data.batch_size` and each replica runs its share in N chunks; `trainer.jit_compile`
compiles each stage's forward pass (and its gradient) on every replica, not the update
(it runs once in cross-replica context over every replica's variables, which one XLA
cluster cannot span); under `mixed_float16` the summed gradients are unscaled before
the update, and in mode=e2e all stages take one loss-scale decision.

`step(x, y)` takes one global batch and splits it evenly over the replicas; `fit` does
the same with the batches of the run's plain `tf.data` iterator, which, unlike a
distributed iterator, can be checkpointed (so a mirrored run resumes too).
"""

from __future__ import annotations

import logging
from dataclasses import replace
from typing import Any, Callable, Sequence

import tensorflow as tf

from chain.config.checks import BatchCut
from chain.config.schema import Settings
from chain.data.catalog import DataInfo
from chain.data.stream_shares import StreamShares
from chain.errors import DeviceError
from chain.planning.planner import MIRRORED, Assignment
from chain.records.results import ReplicaLosses
from chain.records.summaries import MirroredFields, Summary
from chain.steps.report import dropped, report
from chain.steps.tied import sum_shared
from chain.steps.update import apply_update, unscale
from chain.strategies.base import Strategy
from chain.strategies.objectives import Objective
from chain.planning import memory

_TF_STRATEGIES: dict[tuple[str, ...], tf.distribute.MirroredStrategy] = {}


def tf_strategy_for(replicas: Sequence[str]) -> tf.distribute.MirroredStrategy:
    """The process's one MirroredStrategy over `replicas`.

    Reused, never rebuilt: each tf.distribute strategy numbers its collective all-reduce groups and
    instances from the same start, and TensorFlow caches them per process, so a second
    strategy's all-reduce collides with the first's ("Shape mismatch in the collective
    instance", or "joining a group with size 4, but that group has size 2"). Hence, too,
    one process can train mirrored runs over one set of replicas only.
    """
    key = tuple(replicas)
    if key not in _TF_STRATEGIES:
        if _TF_STRATEGIES:
            (other,) = _TF_STRATEGIES
            raise DeviceError(
                f"this process already trains mirrored runs over {', '.join(other)}; "
                f"TensorFlow's all-reduce cannot also serve {', '.join(key)} (start a new process)"
            )
        log = logging.getLogger("tensorflow")
        level = log.level
        log.setLevel(max(level, logging.WARNING))  # the placement table already names the replicas
        try:
            _TF_STRATEGIES[key] = tf.distribute.MirroredStrategy(list(key))
        finally:
            log.setLevel(level)
    return _TF_STRATEGIES[key]


class Mirrored(Strategy):
    """Every stage on every replica of `placement.replicas`; one global batch split evenly over them.

    Runs of one process share one `tf.distribute.MirroredStrategy` (see `tf_strategy_for`).
    """

    name = MIRRORED
    title = "Mirrored"
    steps_in_one_call = False  # the batch is split over the replicas on the host: `repeat`'s loop does not apply

    def __init__(
        self,
        settings: Settings,
        assignment: Assignment,
        info: DataInfo,
        batch_cut: BatchCut,
        learns: type[Objective],
        **bodies: Any,
    ):
        if learns.microbatched:  # notes on a new record: the one planned is never changed
            assignment = self._ignored(settings, assignment)
        if assignment.multi_worker:
            from chain.planning.cluster import multi_worker_tf_strategy

            self.tf_strategy = multi_worker_tf_strategy()
            if self.tf_strategy.num_replicas_in_sync != len(assignment.mirrored_devices):
                raise DeviceError(
                    f"the workers of TF_CONFIG hold {self.tf_strategy.num_replicas_in_sync} replicas, this "
                    f"one planned {len(assignment.mirrored_devices)}: every worker needs the same number of GPUs"
                )
        else:
            self.tf_strategy = tf_strategy_for(assignment.mirrored_devices)
        # Inside this scope every variable becomes a MirroredVariable (device scopes are
        # ignored there, so stages get no device), and each optimizer captures the
        # tf.distribute strategy that sums its gradients.
        with self.tf_strategy.scope():
            super().__init__(settings, assignment, info, batch_cut, learns, **bodies)

    @staticmethod
    def _ignored(settings: Settings, assignment: Assignment) -> Assignment:
        """`assignment` noting the pipeline settings a mirrored replica ignores: it runs its whole share at once."""
        if settings.pipeline.microbatches > 1:
            assignment = assignment.noted(
                f"pipeline.microbatches={settings.pipeline.microbatches} ignored: "
                "a mirrored replica runs its whole share of the batch at once"
            )
        if settings.pipeline.batch_norm != "microbatch":
            assignment = assignment.noted(
                f"pipeline.batch_norm={settings.pipeline.batch_norm} ignored: a mirrored replica "
                "normalizes its whole share of the batch at once, as Keras under MirroredStrategy"
            )
        return assignment

    @property
    def shared_weights(self) -> bool:
        """A cut model's tied weight trains with one loss through the chain (mode=e2e): its holders'
        gradients, all-reduced, are summed (`chain.steps.tied`), as its uses' are on one device."""
        return self.learns.readout

    def devices(self) -> Sequence[str | None]:
        return [None] * len(self.settings.stages)

    def make_step(self) -> Callable:
        objective = self.objective
        per_replica_step = objective.replica_step()
        stages, tf_strategy = self.stages, self.tf_strategy

        def total(per_replica: Any) -> tf.Tensor:
            return tf_strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica, axis=None)

        def train(batch: Any) -> tf.Tensor:
            per_replica_losses, per_replica_grads = tf_strategy.run(per_replica_step, args=(batch,))
            losses = ReplicaLosses(
                tuple(total(v) for v in per_replica_losses.stages), tuple(total(v) for v in per_replica_losses.chain)
            )
            grads = [unscale(s, [total(g) for g in gs]) for s, gs in zip(stages, per_replica_grads)]
            grads = sum_shared(stages, grads)  # a cut model's tied weight: every holder applies the sum of its uses
            outcomes = objective.outcomes(grads, losses)
            grads, norm = objective.clip(grads)  # after the all-reduce, unscaling and the overflow decision
            flags = []
            for s, g, outcome in zip(stages, grads, outcomes):
                own = losses.stages[s.index] if losses.stages else None  # mode=local: the stage's loss joins the guard
                flags.append(dropped(apply_update(s, g, own, outcome)))
            return report(stages, objective.report_values(flags, losses, norm), None)  # no devices: no copies

        return train

    def call(self, x: Any, ys: dict[str, Any]) -> Any:
        return self.step_fn(*self.arguments(x, ys)).numpy()  # per-replica arguments: tf.function dispatches

    def stream_shares(self) -> StreamShares | None:
        """A streamed data set (`data.stream=true`) is read by every replica from its own files
        (`chain.data.stream_shares`): this process's replicas' shares (a host of a multi-host run:
        its own replicas, numbered as the run numbers them); None for data in memory."""
        if not getattr(self.settings.data, "stream", False):
            return None
        local = self.assignment.local_mirrored_devices
        return StreamShares(
            self.assignment.mirrored_devices.index(local[0]), len(local), len(self.assignment.mirrored_devices)
        )

    def arguments(self, x: tf.Tensor, ys: dict[str, tf.Tensor]) -> tuple:
        """One batch as per-replica values, each replica's part contiguous: replica i gets the i-th
        part of a global batch. A host of a multi-host run reading a streamed data set holds only its
        own replicas' parts (`stream_shares`): its batch is cut into those, in order."""
        shares = self.stream_shares()
        first, count = (shares.first, shares.count) if shares else (0, self.tf_strategy.num_replicas_in_sync)
        n = tf.nest.flatten(x)[0].shape[0] // count  # a dict of inputs (keras_hub's): every leaf cut alike

        def part(ctx: tf.distribute.experimental.ValueContext) -> tuple:
            i = ctx.replica_id_in_sync_group - first  # this process's replicas only are asked for
            return tf.nest.map_structure(lambda v: v[i * n : (i + 1) * n], (x, ys))

        return (self.tf_strategy.experimental_distribute_values_from_function(part),)

    def cut_description(self) -> str:
        return (
            f"{self.batch_cut.replicas} replicas x trainer.grad_accum={self.settings.trainer.grad_accum} equal chunks"
        )

    def memory_devices(self) -> list[str]:
        return list(self.assignment.local_mirrored_devices)  # another host's memory cannot be read from here

    def summary(self, summary: Summary) -> Summary:
        # Every replica holds every stage, so memory is measured per replica, not per stage.
        mirrored = MirroredFields(
            list(self.assignment.mirrored_devices),
            self.batch_cut.per_replica,
            [memory.peak_bytes(d) if d in self.memory_devices() else None for d in self.assignment.mirrored_devices],
        )
        return replace(super().summary(summary), mirrored=mirrored)
