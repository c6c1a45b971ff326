"""mode=local: every stage learns its own target through its head; one `tf.function` holds
every stage's work.

For each stage, the input copy, forward pass, tape, gradient and optimizer update sit
inside `with tf.device(stage.device)`. Data crosses devices only through `copy_to`, so
the graph states every transfer, and stages on different devices run concurrently
wherever their inputs allow.
"""

from __future__ import annotations

from typing import Callable, Sequence

import tensorflow as tf

from chain.stages import losses
from chain.stages.stage import Stage
from chain.steps import xla
from chain.steps.ops import add_grads, after, chunks, copy_to, weighted
from chain.steps.report import dropped, report
from chain.steps.update import stage_update, unscale


def local_forward(stage: Stage) -> Callable:
    """mode=local, one stage: `fn(h, y, weight) -> (output, loss, scaled loss)`.

    `loss` is the head's mean loss on `y` plus the body's and head's regularization
    (`losses.regularization`), times `weight` (the chunk's share of the step's examples);
    `scaled loss` is what the tape differentiates (times the loss scale under float16,
    else `loss`).
    """
    head_loss = losses.head_loss(stage.target)

    def fn(h, y, weight):
        out = stage.model(h, training=True)
        loss = head_loss(y, stage.head(out, training=True))
        reg = losses.regularization(stage.model, stage.head)
        loss = weighted(loss if reg is None else loss + reg, weight)
        return out, loss, loss if stage.loss_scale is None else stage.loss_scale.scale_loss(loss)

    return fn


def local_step(stages: Sequence[Stage], grad_accum: int = 1, jit_compile: bool = False) -> Callable:
    """The mode=local step, traceable: `step(x, ys) -> report` (`ReportFormat.per_stage`: each
    stage's loss and whether the guard dropped its update).

    The output that feeds stage k+1 is the body's, with the gradient stopped: stages
    never wait on each other's backward pass. With `grad_accum=N` the batch holds N
    chunks: each stage runs them one at a time, sums their gradients (each chunk's
    loss weighted 1/N, so the sum is the mean over the whole batch) and updates once.
    """
    n = grad_accum
    forwards = {s.index: xla.stage_function(local_forward(s), jit_compile, xla.forward_name(s.index)) for s in stages}
    updates = {s.index: stage_update(s, jit_compile) for s in stages}

    def step(x: tf.Tensor, ys: dict[str, tf.Tensor]) -> tf.Tensor:
        h = x
        values = []
        for s in stages:
            h = copy_to(h, s.device, f"stage_{s.index}")
            y = copy_to(ys[s.target.name], s.device, f"stage_{s.index}_target")
            with tf.device(s.device):
                grads, chunk_losses, outs = None, [], []
                for h_i, y_i in zip(chunks(h, n), chunks(y, n)):
                    with tf.control_dependencies(after(grads)):
                        with tf.GradientTape() as tape:
                            out, loss, scaled = forwards[s.index](h_i, y_i, 1.0 / n)
                        grads = add_grads(grads, tape.gradient(scaled, s.trainable_variables))
                    chunk_losses.append(loss)
                    outs.append(out)
                loss = chunk_losses[0] if n == 1 else tf.add_n(chunk_losses)
                skip = updates[s.index](unscale(s, grads), loss)
                h = tf.stop_gradient(outs[0] if n == 1 else tf.concat(outs, 0))
                values.append([loss, dropped(skip)])
        return report(stages, values, stages[-1].device)

    return step
