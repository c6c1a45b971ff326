"""Timing each layer of a model on the devices that would run it (`placement.balance=time`)."""

from __future__ import annotations

import statistics
import time
from typing import Sequence

import keras
import tensorflow as tf

from chain.stages.cut import Cuttable, piece


def layer_times(c: Cuttable, devices: Sequence[str], batch: int, repeats: int = 7) -> dict[str, list[float]]:
    """For each distinct device, each layer's forward-and-backward time (seconds, median of
    `repeats` after one warm-up call) on a batch of `batch` examples, the layer built there."""
    out: dict[str, list[float]] = {}
    for device in dict.fromkeys(devices):
        times = []
        for i in range(len(c.layers)):
            with tf.device(device):
                model = piece(c, i, i + 1, keras.DTypePolicy("float32"))((), None, f"profile_{i}")
                x = tf.random.stateless_normal((batch, *model.input_shape[1:]), seed=(0, i))

            @tf.function
            def step(x, model=model):
                with tf.device(device):
                    with tf.GradientTape() as tape:
                        tape.watch(x)
                        y = tf.reduce_sum(tf.cast(model(x, training=True), tf.float32))
                    return tape.gradient(y, [x, *model.trainable_variables])

            step(x)  # trace and warm up
            samples = []
            for _ in range(repeats):
                started = time.perf_counter()
                tf.nest.map_structure(lambda t: t.numpy() if t is not None else None, step(x))
                samples.append(time.perf_counter() - started)
            times.append(statistics.median(samples))
        out[device] = times
    return out
