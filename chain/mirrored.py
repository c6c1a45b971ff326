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

The switches: with `trainer.grad_accum=N` the global batch of a step is N x
`data.batch_size` and each replica runs its share in N chunks; `trainer.jit_compile`
compiles each stage's forward pass (and its gradient) on every replica, not the update
(it runs once in cross-replica context over every replica's variables, which one XLA
cluster cannot span); under `mixed_float16` the summed gradients are unscaled before
the update, and in mode=e2e all stages take one loss-scale decision.
"""

from __future__ import annotations

import logging
from typing import Any, Callable, Sequence

import tensorflow as tf

from chain import losses, memory, planner, xla
from chain.engine import add_grads, after, apply_update, chunks, local_forward, shared_outcomes, unscale
from chain.errors import DeviceError
from chain.pipeline import chain_forward
from chain.run import Run, check_chunks
from chain.stages import Stage


def _shares(x: tf.Tensor, n: int, global_batch: int) -> tuple[list[tf.Tensor], tf.Tensor]:
    """This replica's examples cut into `n` chunks, and one chunk's share of the global batch."""
    xs = chunks(x, n)
    return xs, tf.cast(tf.shape(xs[0])[0], tf.float32) / global_batch


def local_replica_step(stages: Sequence[Stage], global_batch: int, grad_accum: int = 1,
                       jit_compile: bool = False) -> Callable:
    """mode=local on one replica: the chain on this replica's part of the batch.

    Losses are this replica's mean times its share of the global batch, so summed over
    replicas they are the mean over the global batch; so are the gradients it returns
    (gradients of the scaled loss under float16). With `grad_accum=N` the replica runs
    its part in N chunks, one at a time, and sums them.
    """
    forwards = [xla.stage_function(local_forward(s), jit_compile, xla.forward_name(s.index)) for s in stages]

    def step(batch: tuple) -> tuple[dict[str, tf.Tensor], list[list[tf.Tensor]]]:
        x, ys = batch
        xs, share = _shares(x, grad_accum, global_batch)
        labels = {k: chunks(v, grad_accum) for k, v in ys.items()}
        stage_losses, grads = {}, [None] * len(stages)
        for i, h in enumerate(xs):
            for s in stages:
                with tf.control_dependencies(after(grads[s.index])):
                    with tf.GradientTape() as tape:
                        out, loss, scaled = forwards[s.index](h, labels[s.target.name][i], share)
                    grads[s.index] = add_grads(grads[s.index], tape.gradient(scaled, s.trainable_variables))
                h = tf.stop_gradient(out)
                key = f"stage_{s.index}"
                stage_losses[key] = loss if i == 0 else stage_losses[key] + loss
        return stage_losses, grads

    return step


def e2e_replica_step(stages: Sequence[Stage], global_batch: int, loss: Callable, grad_accum: int = 1,
                     jit_compile: bool = False) -> Callable:
    """mode=e2e on one replica: the chain as one network, one loss after the last stage.

    `loss(y, pred)` is the mean loss over the examples it is given; scaled by this
    replica's share of the global batch, as in `local_replica_step`. Returns the loss
    and each stage's gradients (of the loss-scaled loss under float16).
    """
    target = stages[-1].target
    last = len(stages) - 1
    forwards = [xla.stage_function(chain_forward(s, loss if s.index == last else None), jit_compile,
                                   xla.forward_name(s.index)) for s in stages]

    def step(batch: tuple) -> tuple[dict[str, tf.Tensor], list[list[tf.Tensor]]]:
        x, ys = batch
        xs, share = _shares(x, grad_accum, global_batch)
        labels = chunks(ys[target.name], grad_accum)
        per_stage = [s.trainable_variables for s in stages]
        total, flat = None, None
        for h, y in zip(xs, labels):
            with tf.control_dependencies(after(flat)):
                with tf.GradientTape() as tape:
                    for s in stages[:-1]:
                        h = forwards[s.index](h)
                    value, scaled = forwards[last](h, y, share)
                flat = add_grads(flat, tape.gradient(scaled, [v for vs in per_stage for v in vs]))
            total = value if total is None else total + value
        grads, start = [], 0
        for vs in per_stage:
            grads.append(flat[start:start + len(vs)])
            start += len(vs)
        return {"loss": total}, grads

    return step


def replica_step(settings: dict[str, Any], stages: Sequence[Stage]) -> Callable:
    """The per-replica training step for the configured mode.

    The global batch of one step is `trainer.grad_accum` x `data.batch_size` examples.
    """
    t = settings["trainer"]
    global_batch = settings["data"]["batch_size"] * t["grad_accum"]
    if settings["mode"] == "local":
        return local_replica_step(stages, global_batch, t["grad_accum"], t["jit_compile"])
    fn = losses.make(settings["loss"], stages[-1].target, settings["data"]["name"])
    return e2e_replica_step(stages, global_batch, fn, t["grad_accum"], t["jit_compile"])


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
            grads = [unscale(s, [self._sum(g) for g in gs]) for s, gs in zip(self.stages, per_replica_grads)]
            # mode=e2e under float16: one loss-scale decision for the whole chain; mode=local:
            # each stage decides from its own loss (outcome None).
            outcomes = (shared_outcomes(self.stages, grads, total["loss"], None) if self.e2e
                        else [None] * len(self.stages))
            for s, g, outcome in zip(self.stages, grads, outcomes):
                own = total.get(f"stage_{s.index}")  # mode=local: the stage's loss joins the guard
                apply_update(s, g, own, outcome)
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
        check_chunks(n, self.grad_accum)  # each replica cuts its part into grad_accum chunks

        def part(ctx: tf.distribute.experimental.ValueContext) -> tuple:
            i = ctx.replica_id_in_sync_group
            return x[i * n:(i + 1) * n], {k: v[i * n:(i + 1) * n] for k, v in ys.items()}

        return self.strategy.experimental_distribute_values_from_function(part)

    def step(self, x: Any, y: Any) -> dict[str, Any]:
        """One optimizer step on one global batch; returns what `Run.step` returns."""
        return self._finish_step(self._step(self._split(tf.convert_to_tensor(x), self._targets(y))))

    def _memory_devices(self) -> list[str]:
        return list(self.placement.replicas)

    def _summary_extras(self) -> dict[str, Any]:
        # Every replica holds every stage, so memory is measured per replica, not per stage.
        return {"replica_devices": list(self.placement.replicas), "per_replica_batch_size": self.per_replica_batch,
                "replica_peak_memory_bytes": [memory.peak_bytes(d) for d in self.placement.replicas]}
