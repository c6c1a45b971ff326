"""XLA (`trainer.jit_compile=true`): each stage's work compiled on its own device.

XLA compiles a cluster for exactly one device, so one compiled function over the whole
step fails as soon as the stages' variables live on several devices. Instead each
piece of one stage's work is a `tf.function(jit_compile=True)` called, inside that
stage's device scope, from the (uncompiled) step; its call op carries the stage's
device, its variables are that stage's, and TensorFlow gives the function's gradient
the same `_XlaMustCompile` attribute, so the backward pass is compiled too:

- the stage's forward pass: mode=local its model, head and loss; mode=e2e its model,
  and for the last stage the chain's loss (each call is one microbatch or chunk);
- its gradient (through the tape, the compiled gradient of the forward function);
- its optimizer update: unscaled gradients in, numerics guard, loss-scale bookkeeping
  and the optimizer's `apply_gradients` as one cluster (not in a mirrored run: there
  the update runs once in cross-replica context over variables on every replica).

Left uncompiled: the copies between devices, the split into microbatches and chunks,
the accumulation of gradients, unscaling, and (float16, mode=e2e) the chain-wide
loss-scale decision, which gathers one flag from every device.
"""

from __future__ import annotations

from typing import Callable

from chain.stages.stage import stage_name


def stage_function(fn: Callable, jit_compile: bool, name: str) -> Callable:
    """`fn` as a compiled function called `name` when `jit_compile`, else `fn` itself
    (traced inline into the step).

    Call the result inside the stage's device scope: the call op takes that device. The
    name shows in the graph (`__inference_stage_01_forward_...`, and its gradient
    `__inference___backward_stage_01_forward_...`), so the placement of each compiled
    piece can be checked.
    """
    if not jit_compile:
        return fn
    import tensorflow as tf

    fn.__name__ = name
    return tf.function(fn, jit_compile=True, autograph=False)


def forward_name(stage: int) -> str:
    """The compiled forward function of stage `stage`."""
    return f"{stage_name(stage)}_forward"


def update_name(stage: int) -> str:
    """The compiled update function of stage `stage`."""
    return f"{stage_name(stage)}_update"
