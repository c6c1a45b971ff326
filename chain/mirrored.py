"""The mirrored fallback: the whole chain on every replica, trained data-parallel.

With fewer cards than stages and a chain that fits one card, `placement.fallback=mirrored`
builds every stage under a `tf.distribute.MirroredStrategy` (each variable and optimizer
slot then has a copy on every replica device) and trains in a custom loop: each replica
runs the composed chain on its share of the global batch (`data.batch_size`), scales
each stage's loss by that share so that the sum over replicas is the global-batch mean,
and returns its gradients. The step sums them over replicas and applies each stage's
update once, in cross-replica context: the numerics guard wraps every update in a
`tf.cond`, and an all-reduce (a synchronisation point) may not sit inside one.

`mode=local` keeps its meaning on every replica: each stage its own head, loss and
optimizer, the gradient stopped between stages. `mode=e2e` runs the composed chain with
one loss after the last stage, each stage's optimizer updating its own variables. In
both, one mirrored step computes the same losses and the same update as one pipelined
step on the same global batch (for e2e: any schedule, any number of microbatches).
"""

from __future__ import annotations

import logging
from typing import Any, Callable, Sequence

import tensorflow as tf

from chain import losses, memory, planner
from chain.engine import apply_update, loss_fn
from chain.errors import DeviceError
from chain.run import Run
from chain.stages import Stage


def local_replica_step(stages: Sequence[Stage], global_batch: int) -> Callable:
    """mode=local on one replica: the chain on this replica's part of the batch.

    Losses are this replica's mean times its share of the global batch, so summed over
    replicas they are the mean over the global batch; so are the gradients it returns.
    """

    def step(batch: tuple) -> tuple[dict[str, tf.Tensor], list[list[tf.Tensor]]]:
        x, ys = batch
        share = tf.cast(tf.shape(x)[0], tf.float32) / global_batch
        h = x
        stage_losses, grads = {}, []
        for s in stages:
            with tf.GradientTape() as tape:
                out = s.model(h, training=True)
                loss = loss_fn(s.target, ys[s.target.name], s.head(out, training=True)) * share
            grads.append(tape.gradient(loss, s.trainable_variables))
            h = tf.stop_gradient(out)
            stage_losses[f"stage_{s.index}"] = loss
        return stage_losses, grads

    return step


def e2e_replica_step(stages: Sequence[Stage], global_batch: int, loss: Callable) -> Callable:
    """mode=e2e on one replica: the chain as one network, one loss after the last stage.

    `loss(y, pred)` is the mean loss over the examples it is given; scaled by this
    replica's share of the global batch, as in `local_replica_step`. Returns the loss
    and each stage's gradients.
    """
    target = stages[-1].target

    def step(batch: tuple) -> tuple[dict[str, tf.Tensor], list[list[tf.Tensor]]]:
        x, ys = batch
        share = tf.cast(tf.shape(x)[0], tf.float32) / global_batch
        with tf.GradientTape() as tape:
            h = x
            for s in stages:
                h = s.model(h, training=True)
            total = loss(ys[target.name], h) * share
        per_stage = [s.trainable_variables for s in stages]
        flat = tape.gradient(total, [v for vs in per_stage for v in vs])
        grads, start = [], 0
        for vs in per_stage:
            grads.append(flat[start:start + len(vs)])
            start += len(vs)
        return {"loss": total}, grads

    return step


def replica_step(settings: dict[str, Any], stages: Sequence[Stage]) -> Callable:
    """The per-replica training step for the configured mode."""
    global_batch = settings["data"]["batch_size"]
    if settings["mode"] == "local":
        return local_replica_step(stages, global_batch)
    fn = losses.make(settings["loss"], stages[-1].target, settings["data"]["name"])
    return e2e_replica_step(stages, global_batch, fn)


_STRATEGIES: dict[tuple[str, ...], tf.distribute.MirroredStrategy] = {}


def strategy_for(replicas: Sequence[str]) -> tf.distribute.MirroredStrategy:
    """The process's one MirroredStrategy over `replicas`.

    Reused, never rebuilt: each strategy numbers its collective all-reduce groups and
    instances from the same start, and TensorFlow caches them per process, so a second
    strategy's all-reduce collides with the first's ("Shape mismatch in the collective
    instance", or "joining a group with size 4, but that group has size 2"). Hence, too,
    one process can train mirrored runs over one set of replicas only.
    """
    key = tuple(replicas)
    if key not in _STRATEGIES:
        if _STRATEGIES:
            (other,) = _STRATEGIES
            raise DeviceError(f"this process already trains mirrored runs over {', '.join(other)}; "
                             f"TensorFlow's all-reduce cannot also serve {', '.join(key)} (start a new process)")
        log = logging.getLogger("tensorflow")
        level = log.level
        log.setLevel(max(level, logging.WARNING))  # the placement table already names the replicas
        try:
            _STRATEGIES[key] = tf.distribute.MirroredStrategy(list(key))
        finally:
            log.setLevel(level)
    return _STRATEGIES[key]


class MirroredRun(Run):
    """A run with every stage mirrored on `placement.replicas`; same surface as `Run`.

    `step(x, y)` takes one global batch and splits it evenly over the replicas; `fit`
    does the same with the batches of the run's plain `tf.data` iterator, which, unlike
    a distributed iterator, can be checkpointed (so a mirrored run resumes too).

    Runs of one process share one strategy (see `strategy_for`).
    """

    def __init__(self, settings: dict[str, Any], placement: planner.Placement, run_dir: str | None):
        self.strategy = strategy_for(placement.replicas)
        self.per_replica_batch = planner.check_batch(settings["data"]["batch_size"], placement)
        # Run builds the stages and their optimizers. Inside this scope every variable
        # becomes a MirroredVariable (device scopes are ignored there, so stages get no
        # device), and each optimizer captures the strategy that sums its gradients.
        # Run's pipelined step is replaced below before it is ever traced.
        with self.strategy.scope():
            super().__init__(settings, placement, run_dir)
        if self.schedule is not None and self.schedule.microbatches > 1:
            placement.notes.append(f"pipeline.microbatches={self.schedule.microbatches} ignored: "
                                   "a mirrored replica runs its whole share of the batch at once")
        self.schedule = None  # no pipeline: every replica runs the whole chain
        per_replica_step = replica_step(settings, self.stages)

        @tf.function
        def train(batch: Any) -> dict[str, tf.Tensor]:
            per_replica_losses, per_replica_grads = self.strategy.run(per_replica_step, args=(batch,))
            total = {k: self._sum(v) for k, v in per_replica_losses.items()}
            for s, grads in zip(self.stages, per_replica_grads):
                own = total.get(f"stage_{s.index}")  # mode=local: the stage's loss joins the guard
                apply_update(s, [self._sum(g) for g in grads], own)
            return total

        self._step = train

    def _sum(self, per_replica: Any) -> tf.Tensor:
        return self.strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica, axis=None)

    def _split(self, x: tf.Tensor, ys: dict[str, tf.Tensor]) -> Any:
        """One global batch as per-replica values: replica i gets the i-th contiguous part."""
        n_replicas = self.strategy.num_replicas_in_sync
        if x.shape[0] % n_replicas:
            raise ValueError(f"a batch of {x.shape[0]} examples does not divide over {n_replicas} replicas")
        n = x.shape[0] // n_replicas

        def part(ctx: tf.distribute.experimental.ValueContext) -> tuple:
            i = ctx.replica_id_in_sync_group
            return x[i * n:(i + 1) * n], {k: v[i * n:(i + 1) * n] for k, v in ys.items()}

        return self.strategy.experimental_distribute_values_from_function(part)

    def step(self, x: Any, y: Any) -> dict[str, Any]:
        """One optimizer step on one global batch; returns what `Run.step` returns."""
        return self._finish_step(self._step(self._split(tf.convert_to_tensor(x), self._targets(y))))

    def _pipeline_summary(self) -> dict[str, Any]:
        if not self.e2e:
            return {}
        return {"loss_fn": self.settings["loss"], "target": self.stages[-1].target.name}

    def _memory_devices(self) -> list[str]:
        return list(self.placement.replicas)

    def _summary_extras(self) -> dict[str, Any]:
        # Every replica holds every stage, so memory is measured per replica, not per stage.
        return {"replica_devices": list(self.placement.replicas), "per_replica_batch_size": self.per_replica_batch,
                "replica_peak_memory_bytes": [memory.peak_bytes(d) for d in self.placement.replicas]}
