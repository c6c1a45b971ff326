"""Timing each layer of a model on the devices that would run it (`placement.balance=time`)."""

from __future__ import annotations

import statistics
import time
from typing import Sequence

import keras
import tensorflow as tf

from chain.stages.cut import Cuttable, piece


INNER = 8  # forward-and-backward passes per timed call


def _timed(fn, x, repeats: int) -> float:
    fn(x)  # trace and warm up
    samples = []
    for _ in range(repeats):
        started = time.perf_counter()
        tf.nest.map_structure(lambda t: t.numpy() if t is not None else None, fn(x))
        samples.append(time.perf_counter() - started)
    return statistics.median(samples)


def layer_times(c: Cuttable, devices: Sequence[str], batch: int, repeats: int = 7) -> dict[str, list[float]]:
    """For each distinct device, each layer's forward-and-backward time in seconds on a batch of
    `batch` examples, the layer built there: the median of `repeats` calls of `INNER` passes,
    less a call that passes the same input through nothing (a call's own cost, ~0.1-0.3 ms on
    a CPU, is paid once per step in training, not once per layer), divided by `INNER`."""
    out: dict[str, list[float]] = {}
    for device in dict.fromkeys(devices):
        times = []
        for i in range(len(c.layers)):
            with tf.device(device):
                model = piece(c, i, i + 1, keras.DTypePolicy("float32"))((), None, f"profile_{i}")
                x = tf.random.stateless_normal((batch, *model.input_shape[1:]), seed=(0, i))

            @tf.function
            def passes(x, model=model, n=INNER):
                grads = []
                with tf.device(device):
                    for _ in range(n):
                        with tf.GradientTape() as tape:
                            tape.watch(x)
                            y = tf.reduce_sum(tf.cast(model(x, training=True), tf.float32))
                        grads.append(tape.gradient(y, [x, *model.trainable_variables]))
                        x = x + 0.0 * grads[-1][0]  # each pass waits for the one before
                return grads

            @tf.function
            def nothing(x):
                with tf.device(device):
                    return tf.identity(x)

            work = _timed(passes, x, repeats) - _timed(nothing, x, repeats)
            times.append(max(work, 1e-7) / INNER)
        out[device] = times
    return out
