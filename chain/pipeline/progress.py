"""Markers of a running pipeline step: how far each device has come, readable while the step runs.

`trainer.stall_s` asks where a stalled step waits (`chain.pipeline.stalled`). The step cannot be
asked, and a device's own variable cannot be read while a worker is wedged, so the step tells
the host: one int64 variable on the host (the client's CPU in a cluster) counts the steps begun,
and one per device row holds `step * stride + n`, n the row's actions finished in that step. After
each action the host assigns its row's marker once the action's ops are done; nothing of the step
waits on a marker (the stage's next action waits, as before, on the action itself or its release),
so the markers only add a small assignment on the host per action. `read()` reads them from any
thread, eagerly, while the step runs.
"""

from __future__ import annotations

from typing import Sequence

import tensorflow as tf

from chain.schedule.schedules import Schedule
from chain.pipeline.stalled import Position, decode, stride


class Progress:
    """The markers of one compiled pipeline step (`replicas` copies of `schedule`, `grad_accum` rounds).

    Built eagerly, once (the variables live outside the step); `begin` and `mark` are called while
    the step is traced."""

    def __init__(self, schedule: Schedule, grad_accum: int, host: str, replicas: int = 1):
        self.schedule, self.grad_accum, self.host = schedule, grad_accum, host
        self.stride = stride(schedule, grad_accum)
        with tf.device(host):
            self.started = tf.Variable(0, dtype=tf.int64, trainable=False, name="steps_begun")
            self.markers = [
                tf.Variable(0, dtype=tf.int64, trainable=False, name=f"progress_row{i}")
                for i in range(replicas * schedule.devices)
            ]

    def begin(self, inputs: Sequence[tf.Tensor]) -> tf.Tensor:
        """In the step, once: count it begun once its batch is there; returns `step * stride`, the base
        of its markers' values."""
        with tf.device(self.host), tf.control_dependencies(list(inputs)):
            return self.started.assign_add(1, name="step_begun") * self.stride

    def mark(self, base: tf.Tensor, row: int, finished: int, done: tf.Operation, name: str) -> None:
        """In the step: after `done` (an action's end), row `row` has finished `finished` actions (the
        ops in name scope `name`)."""
        with tf.name_scope(name), tf.device(self.host), tf.control_dependencies([done]):
            self.markers[row].assign(base + finished, read_value=False)

    def begun(self) -> int:
        """How many steps have begun (the one variable a call's start needs; `read` reads them all)."""
        return int(self.started.numpy())

    def read(self) -> Position:
        """Where the running (or last) step is, read eagerly from the host's variables (any thread)."""
        started = int(self.started.numpy())
        return decode(started, [int(v.numpy()) for v in self.markers], self.schedule, self.grad_accum)
