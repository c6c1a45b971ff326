"""The mirrored fallback: the whole chain on every replica, trained data-parallel.

With fewer cards than stages and a chain that fits one card, `placement.fallback=mirrored`
builds every stage under a `tf.distribute.MirroredStrategy` (each variable and optimizer
slot then has a copy on every replica device) and trains in a custom loop: each replica
runs the composed chain on its share of the global batch (`data.batch_size`), scales
each stage's loss by that share so that the sum over replicas is the global-batch mean,
and each stage's optimizer sums the gradients over replicas before its update.

`mode=local` keeps its meaning on every replica: each stage its own head, loss and
optimizer, the gradient stopped between stages. One mirrored step therefore computes
the same losses and the same update as one pipelined step on the same global batch.
"""

from __future__ import annotations

import logging
from typing import Any, Callable, Iterator, Sequence

import tensorflow as tf

from chain import planner
from chain.engine import apply_update, loss_fn
from chain.errors import ConfigError
from chain.run import Run
from chain.stages import Stage


def local_replica_step(stages: Sequence[Stage], global_batch: int) -> Callable:
    """mode=local on one replica: the chain on this replica's part of the batch.

    Losses are this replica's mean times its share of the global batch, so summed over
    replicas (the optimizer's all-reduce of the gradients, `strategy.reduce` of the
    losses) they are the mean over the global batch.
    """

    def step(batch: tuple) -> dict[str, tf.Tensor]:
        x, ys = batch
        share = tf.cast(tf.shape(x)[0], tf.float32) / global_batch
        h = x
        losses = {}
        for s in stages:
            with tf.GradientTape() as tape:
                out = s.model(h, training=True)
                loss = loss_fn(s.target, ys[s.target.name], s.head(out, training=True)) * share
            apply_update(s, tape.gradient(loss, s.trainable_variables))
            h = tf.stop_gradient(out)
            losses[f"stage_{s.index}"] = loss
        return losses

    return step


REPLICA_STEPS = {"local": local_replica_step}


def _quietly(make: Callable[[], Any]) -> Any:
    """Call `make` with TensorFlow's INFO log off: the placement table already names the replicas."""
    log = logging.getLogger("tensorflow")
    level = log.level
    log.setLevel(max(level, logging.WARNING))
    try:
        return make()
    finally:
        log.setLevel(level)


class MirroredRun(Run):
    """A run with every stage mirrored on `placement.replicas`; same surface as `Run`.

    `step(x, y)` takes one global batch and splits it evenly over the replicas; `fit`
    distributes `batches()` with `strategy.experimental_distribute_dataset`.

    One process can train mirrored runs over one set of replicas only: TensorFlow's
    collective all-reduce numbers its groups per process, and a second strategy over
    other devices collides with the first ("joining a group with size 4, but that
    group has size 2").
    """

    def __init__(self, settings: dict[str, Any], placement: planner.Placement, run_dir: str | None):
        mode = settings["mode"]
        if mode not in REPLICA_STEPS:
            raise ConfigError(f"mode={mode} with placement.fallback=mirrored is not supported yet; "
                              f"allowed: {', '.join(REPLICA_STEPS)}")
        self.strategy = _quietly(lambda: tf.distribute.MirroredStrategy(placement.replicas))
        self.per_replica_batch = planner.check_batch(settings["data"]["batch_size"], placement)
        # Run builds the stages and their optimizers. Inside this scope every variable
        # becomes a MirroredVariable (device scopes are ignored there, so stages get no
        # device), and each optimizer captures the strategy that sums its gradients.
        # Run's pipelined step is replaced below before it is ever traced.
        with self.strategy.scope():
            super().__init__(settings, placement, run_dir)
        replica_step = REPLICA_STEPS[mode](self.stages, settings["data"]["batch_size"])

        @tf.function
        def train(batch: Any) -> dict[str, tf.Tensor]:
            per_replica = self.strategy.run(replica_step, args=(batch,))
            return {k: self.strategy.reduce(tf.distribute.ReduceOp.SUM, v, axis=None) for k, v in per_replica.items()}

        self._step = train

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

    def _losses(self, losses: dict[str, tf.Tensor]) -> dict[str, Any]:
        per_stage = [float(losses[f"stage_{s.index}"]) for s in self.stages]
        return {"loss": float(sum(per_stage)), "stage_losses": per_stage}

    def step(self, x: Any, y: Any) -> dict[str, Any]:
        """One optimizer step on one global batch; returns `loss` (sum over stages) and `stage_losses`."""
        return self._losses(self._step(self._split(tf.convert_to_tensor(x), self._targets(y))))

    def _fit_batches(self) -> Iterator:
        return iter(self.strategy.experimental_distribute_dataset(self.batches()))

    def _fit_step(self, batch: Any) -> dict[str, Any]:
        return self._losses(self._step(batch))

    def _summary_extras(self) -> dict[str, Any]:
        return {"replica_devices": list(self.placement.replicas), "per_replica_batch_size": self.per_replica_batch}
