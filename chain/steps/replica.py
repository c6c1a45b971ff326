"""The step of one replica in a mirrored run: the whole chain on this replica's share of the batch.

Each replica scales its losses by its share of the global batch, so that summed over
replicas they are the global-batch mean, and returns its gradients; the strategy
(`chain.strategies.mirrored`) sums them and applies each stage's update once.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import tensorflow as tf

from chain.records.results import ReplicaLosses
from chain.stages.stage import Stage
from chain.steps import xla
from chain.steps.forward import chain_forward
from chain.steps.local import local_forward
from chain.steps.ops import add_grads, after, chunks, chunks_of


def _shares(x: Any, n: int, global_batch: int) -> tuple[list[Any], tf.Tensor]:
    """This replica's examples (a tensor or a dict of them) cut into `n` chunks, and one chunk's share
    of the global batch."""
    xs = chunks_of(x, n)
    return xs, tf.cast(tf.shape(tf.nest.flatten(xs[0])[0])[0], tf.float32) / global_batch


def local_replica_step(
    stages: Sequence[Stage], global_batch: int, grad_accum: int = 1, jit_compile: bool = False
) -> Callable:
    """mode=local on one replica: `step((x, ys)) -> (ReplicaLosses(stages=...), per-stage gradients)`.

    Losses are this replica's mean times its share of the global batch, so summed over
    replicas they are the mean over the global batch; so are the gradients it returns
    (gradients of the scaled loss under float16). With `grad_accum=N` the replica runs
    its part in N chunks, one at a time, and sums them.
    """
    forwards = [xla.stage_function(local_forward(s), jit_compile, xla.forward_name(s.index)) for s in stages]

    def step(batch: tuple) -> tuple[ReplicaLosses, list[list[tf.Tensor]]]:
        x, ys = batch
        xs, share = _shares(x, grad_accum, global_batch)
        labels = {k: chunks(v, grad_accum) for k, v in ys.items()}
        stage_losses, grads = [None] * len(stages), [None] * len(stages)
        for i, h in enumerate(xs):
            for s in stages:
                with tf.control_dependencies(after(grads[s.index])):
                    with tf.GradientTape() as tape:
                        out, loss, scaled = forwards[s.index](h, labels[s.target.name][i], share)
                    grads[s.index] = add_grads(grads[s.index], tape.gradient(scaled, s.trainable_variables))
                h = tf.stop_gradient(out)
                stage_losses[s.index] = loss if i == 0 else stage_losses[s.index] + loss
        return ReplicaLosses(stages=tuple(stage_losses)), grads

    return step


def e2e_replica_step(
    stages: Sequence[Stage], global_batch: int, loss: Callable, grad_accum: int = 1, jit_compile: bool = False
) -> Callable:
    """mode=e2e on one replica: `step((x, ys)) -> (ReplicaLosses(chain=(loss,)), per-stage gradients)`.

    `loss(y, pred)` is the mean loss over the examples it is given; with every stage's
    regularization added, scaled by this replica's share of the global batch, as in
    `local_replica_step` (Keras under a `MirroredStrategy` divides each replica's
    `model.losses` by the number of replicas: the same share, replicas' batches being
    equal). With `ignore_class` the loss of a chunk is weighed by its real labels' share of the
    global batch's instead. Gradients are of the loss-scaled loss under float16.
    """
    target = stages[-1].target
    last = len(stages) - 1
    forwards = [
        xla.stage_function(chain_forward(s, loss if s.index == last else None), jit_compile, xla.forward_name(s.index))
        for s in stages
    ]

    def step(batch: tuple) -> tuple[ReplicaLosses, list[list[tf.Tensor]]]:
        x, ys = batch
        xs, share = _shares(x, grad_accum, global_batch)
        labels = chunks(ys[target.name], grad_accum)
        per_stage = [s.trainable_variables for s in stages]
        total, flat = None, None
        weights = [None] * len(labels)
        if getattr(loss, "ignore_class", None) is not None:
            # Each chunk weighs its real labels over every replica's (summed across the replicas, before
            # any backward), so that the replicas' summed losses and gradients are the mean over the
            # global batch's real labels, as on one device, whatever number each replica holds.
            whole = tf.distribute.get_replica_context().all_reduce(
                tf.distribute.ReduceOp.SUM, loss.real(ys[target.name])
            )
            weights = loss.weights(labels, whole)
        for h, y, loss_weight in zip(xs, labels, weights):
            with tf.control_dependencies(after(flat)):
                with tf.GradientTape() as tape:
                    regs, scaled_regs = [], []
                    for s in stages[:-1]:
                        h, reg, scaled_reg = forwards[s.index](h, share)
                        if reg is not None:
                            regs.append(reg)
                            scaled_regs.append(scaled_reg)
                    value, scaled = forwards[last](h, y, share, loss_weight)
                    if regs:  # every stage's regularization is part of the chain's loss
                        value, scaled = tf.add_n([value, *regs]), tf.add_n([scaled, *scaled_regs])
                flat = add_grads(flat, tape.gradient(scaled, [v for vs in per_stage for v in vs]))
            total = value if total is None else total + value
        grads, start = [], 0
        for vs in per_stage:
            grads.append(flat[start : start + len(vs)])
            start += len(vs)
        return ReplicaLosses(chain=(total,)), grads

    return step
