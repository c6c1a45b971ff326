"""The training step: one `tf.function` that holds every stage's work.

For each stage, the input copy, forward pass, tape, gradient and optimizer update sit
inside `with tf.device(stage.device)`. Data crosses devices only through `copy_to`,
an identity op placed on the destination device, so the graph states every transfer.
Because the whole step is one dataflow graph, stages on different devices run
concurrently wherever their inputs allow.

The switches of `trainer` and `precision` act here and in `chain.pipeline` and
`chain.mirrored`: `grad_accum=N` cuts each step's batch into N chunks that run one at
a time before one update; `jit_compile` replaces a stage's forward function and its
update by XLA-compiled ones (`chain.xla`); under `mixed_float16` each stage's loss is
scaled inside the tape and its gradients unscaled before `apply_update`
(`chain.loss_scale`).
"""

from __future__ import annotations

from typing import Callable, Sequence

import tensorflow as tf

from chain import loss_scale, losses, xla
from chain.numerics import all_finite, guarded_update
from chain.stages import Stage

COPY_PREFIX = "copy_to_"


def copy_to(tensor: tf.Tensor, device: str, what: str) -> tf.Tensor:
    """Copy `tensor` onto `device`: the only way data moves between stages' devices."""
    with tf.device(device):
        return tf.identity(tensor, name=f"{COPY_PREFIX}{what}")


def chunks(t: tf.Tensor, n: int) -> list[tf.Tensor]:
    """`t` cut into `n` equal parts along the batch axis (`[t]` itself for n=1: no split op)."""
    return [t] if n == 1 else tf.split(t, n, name="chunks")


def add_grads(acc: list | None, grads: Sequence) -> list:
    """Accumulate `grads` into `acc` elementwise (None: no gradient so far)."""
    if acc is None:
        return list(grads)
    return [g if a is None else a if g is None else a + g for a, g in zip(acc, grads)]


def after(grads: list | None) -> list[tf.Tensor]:
    """What the next chunk waits for: the gradients accumulated so far (so that chunks run one
    at a time and only one chunk's activations are alive, which is what gradient accumulation
    is for; a dataflow graph would otherwise run all chunks at once)."""
    return [g for g in grads or [] if g is not None]


def unscale(stage: Stage, grads: Sequence[tf.Tensor | None]) -> list[tf.Tensor | None]:
    """Gradients of a stage's scaled loss divided by its loss scale (precision=mixed_float16);
    unchanged otherwise."""
    return list(grads) if stage.loss_scale is None else stage.loss_scale.unscale(grads)


def apply_update(stage: Stage, grads: Sequence[tf.Tensor], loss: tf.Tensor | None = None,
                 outcome: tf.Tensor | None = None) -> tf.Tensor:
    """Apply one update of `stage`'s optimizer (call inside the stage's device scope).

    Every mode applies its updates through here, so numerics guards and loss scaling
    live in one place. `grads` are true (unscaled, see `unscale`) gradients. The update
    is applied only if `loss` (when given) and `grads` are finite (`chain.numerics`).
    Under float16 loss scaling, `outcome` is the stage's group decision
    (`chain.loss_scale.decide`; `shared_outcomes` for a chain with one loss); without
    it the stage is a group of its own and decides from `loss` and `grads`. Returns
    whether the update was applied.
    """
    variables = stage.trainable_variables

    def apply() -> None:
        stage.optimizer.apply_gradients(zip(grads, variables))

    def guarded() -> tf.Tensor:
        return guarded_update(stage.skipped, loss, grads, apply)

    if stage.loss_scale is None:
        return guarded()
    if outcome is None:
        outcome = loss_scale.decide(loss, [all_finite(None, grads)], stage.loss_scale.scale)
    return stage.loss_scale.update(outcome, guarded)


def shared_outcomes(stages: Sequence[Stage], grads: Sequence[Sequence[tf.Tensor]], loss: tf.Tensor,
                    device: str | None) -> list[tf.Tensor | None]:
    """One loss-scale outcome for stages that share one loss (mode=e2e), decided on `device`.

    Each stage's finite flag is computed on its device and copied to `device` (where
    the loss is); the outcome is copied back to every stage, so all of them apply, or
    all skip and halve their copy of the scale, which therefore stays the same on every
    stage. Without loss scaling: `[None] * len(stages)`.
    """
    if stages[-1].loss_scale is None:
        return [None] * len(stages)
    with tf.name_scope("loss_scale"):
        flags = []
        for s, g in zip(stages, grads):
            with tf.device(s.device):
                flag = all_finite(None, g)
            flags.append(copy_to(flag, device, f"finite_s{s.index}"))
        with tf.device(device):
            outcome = loss_scale.decide(loss, flags, stages[-1].loss_scale.scale)
        return [copy_to(outcome, s.device, f"outcome_s{s.index}") for s in stages]


def _weighted(loss: tf.Tensor, weight) -> tf.Tensor:
    return loss if isinstance(weight, float) and weight == 1.0 else loss * weight


def local_forward(stage: Stage) -> Callable:
    """mode=local, one stage: `fn(h, y, weight) -> (output, loss, scaled loss)`.

    `loss` is the head's mean loss on `y` times `weight` (the chunk's share of the
    step's examples); `scaled loss` is what the tape differentiates (times the loss
    scale under float16, else `loss`).
    """
    head_loss = losses.head_loss(stage.target)

    def fn(h, y, weight):
        out = stage.model(h, training=True)
        loss = _weighted(head_loss(y, stage.head(out, training=True)), weight)
        return out, loss, loss if stage.loss_scale is None else stage.loss_scale.scale_loss(loss)

    return fn


def stage_update(stage: Stage, jit_compile: bool = False) -> Callable:
    """`fn(grads, loss=None, outcome=None)`: `apply_update` for `stage`, compiled with XLA if asked."""

    def fn(grads, loss=None, outcome=None):
        return apply_update(stage, grads, loss, outcome)

    return xla.stage_function(fn, jit_compile, xla.update_name(stage.index))


def local_step(stages: Sequence[Stage], grad_accum: int = 1, jit_compile: bool = False) -> Callable:
    """mode=local: every stage learns its own target from the previous stage's output.

    The output that feeds stage k+1 is the body's, with the gradient stopped: stages
    never wait on each other's backward pass. With `grad_accum=N` the batch holds N
    chunks: each stage runs them one at a time, sums their gradients (each chunk's
    loss weighted 1/N, so the sum is the mean over the whole batch) and updates once.
    """
    n = grad_accum
    forwards = {s.index: xla.stage_function(local_forward(s), jit_compile, xla.forward_name(s.index)) for s in stages}
    updates = {s.index: stage_update(s, jit_compile) for s in stages}

    @tf.function
    def step(x: tf.Tensor, ys: dict[str, tf.Tensor]) -> dict[str, tf.Tensor]:
        h = x
        losses = {}
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
                updates[s.index](unscale(s, grads), loss)
                h = tf.stop_gradient(outs[0] if n == 1 else tf.concat(outs, 0))
            losses[f"stage_{s.index}"] = loss
        return losses

    return step


def forward(stages: Sequence[Stage], x: tf.Tensor) -> dict[str, tf.Tensor]:
    """Inference through the chain: `body_k` is stage k's output, `head_k` its head's.

    Each stage runs on its device; used to compare a chain with its exports and with a
    re-staged copy of itself.
    """
    out = {}
    h = tf.convert_to_tensor(x)
    for s in stages:
        h = copy_to(h, s.device, f"stage_{s.index}")
        with tf.device(s.device):
            h = s.model(h, training=False)
            out[f"body_{s.index}"] = h
            if s.head is not None:
                out[f"head_{s.index}"] = s.head(h, training=False)
    return out


def make_step(settings: dict, stages: Sequence[Stage], schedule=None) -> Callable:
    """The compiled training step for the configured mode.

    mode=e2e runs `schedule` (a `chain.schedules.Schedule`; default: the one
    `pipeline.schedule` and `pipeline.microbatches` name) and returns `{"loss": ...}`;
    mode=local returns one loss per stage, `{"stage_K": ...}`. Each step takes a batch of
    `trainer.grad_accum` x `data.batch_size` examples and makes one update per stage.
    """
    t = settings["trainer"]
    if settings["mode"] == "local":
        return local_step(stages, t["grad_accum"], t["jit_compile"])
    if settings["mode"] == "e2e":
        from chain import pipeline, schedules  # pipeline imports this module

        if schedule is None:
            p = settings["pipeline"]
            schedule = schedules.build(p["schedule"], len(stages), p["microbatches"])
        return pipeline.make_e2e_step(settings, stages, schedule, stages[-1].target)
    raise NotImplementedError(f"mode={settings['mode']}")
