"""The one timer and the one call-cost probe of both timings: `chain.stages.timing` (`placement.balance=time`)
and `chain.autoplan.measure` (`placement.plan=auto`)."""

from __future__ import annotations

import time
from typing import Callable

import tensorflow as tf


def seconds(fn: Callable, *args) -> float:
    """Wall seconds of one call `fn(*args)`, its results read back to the host (a structure of tensors, None
    left out; an embedding's gradient, IndexedSlices, read as its tensors)."""
    started = time.perf_counter()
    out = fn(*args)
    if isinstance(out, tf.Tensor):  # read directly: the probe's own cost stays out of what it times
        out.numpy()
    else:
        tf.nest.map_structure(lambda t: None if t is None else t.numpy(), out, expand_composites=True)
    return time.perf_counter() - started


def call_costs(device: str, x: tf.Tensor, calls: int) -> list[float]:
    """A call's own cost, `calls` times: the seconds of a compiled call that passes `x` through on `device`
    (after one untimed call, which traces). The caller takes the statistic it needs (the least, the median)."""

    @tf.function(autograph=False)
    def nothing(x):
        with tf.device(device):
            return tf.identity(x)

    seconds(nothing, x)
    return [seconds(nothing, x) for _ in range(calls)]
