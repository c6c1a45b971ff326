"""Markers of a running pipeline step: how far each device has come, readable while the step runs.

`trainer.stall_s` asks where a stalled step waits (`chain.pipeline.stalled`). The step cannot be
asked, so it leaves markers: one int64 variable on the host (the client's CPU in a cluster) counts
the steps begun, and one per device row, on the CPU of the process that holds the row's device
(a cluster worker's own), holds `step * stride + n`, n the row's actions finished in that step.
After each action that process assigns its row's marker once the action's ops are done. Nothing of
the step waits on a marker, and no marker crosses processes: a marker the client kept would cost
every action a message from its worker. The watch polls only the host's count (`begun`) and reads
the rows (`read`) once it reports a stall, each with `ANSWER_S` to answer: a worker that is stopped,
or whose only thread is inside a long op, does not answer, and the report says so for its row.
"""

from __future__ import annotations

import threading
import time
from typing import Sequence

import tensorflow as tf

from chain.schedule.schedules import Schedule
from chain.pipeline.stalled import ANSWER_S, Position, decode, stride


class Progress:
    """The markers of one compiled pipeline step (`schedule`, `grad_accum` rounds) with a row per entry of
    `rows`: the CPU that keeps it (copy 0's device rows, then copy 1's, ...).

    Built eagerly, once (the variables live outside the step); `begin` and `mark` are called while
    the step is traced."""

    def __init__(self, schedule: Schedule, grad_accum: int, host: str, rows: Sequence[str]):
        self.schedule, self.grad_accum, self.host, self.rows = schedule, grad_accum, host, list(rows)
        self.stride = stride(schedule, grad_accum)
        with tf.device(host):
            self.started = tf.Variable(0, dtype=tf.int64, trainable=False, name="steps_begun")
        self.markers = []
        for i, where in enumerate(self.rows):
            with tf.device(where):
                self.markers.append(tf.Variable(0, dtype=tf.int64, trainable=False, name=f"progress_row{i}"))

    def begin(self, inputs: Sequence[tf.Tensor]) -> tf.Tensor:
        """In the step, once: count it begun once its batch is there; returns `step * stride`, the base
        of its markers' values."""
        with tf.device(self.host), tf.control_dependencies(list(inputs)):
            return self.started.assign_add(1, name="step_begun") * self.stride

    def mark(self, base: tf.Tensor, row: int, finished: int, done: tf.Operation, name: str) -> None:
        """In the step: after `done` (an action's end), row `row` has finished `finished` actions (the
        ops in name scope `name`)."""
        with tf.name_scope(name), tf.device(self.rows[row]), tf.control_dependencies([done]):
            self.markers[row].assign(base + finished, read_value=False)

    def begun(self) -> int:
        """How many steps have begun (the host's one variable: what the watch polls)."""
        return int(self.started.numpy())

    def read(self, answer_s: float = ANSWER_S) -> Position:
        """Where the running (or last) step is, read eagerly (any thread); a row whose marker did not
        answer within `answer_s` seconds is unknown (None)."""
        started = int(self.started.numpy())
        values: list[int | None] = [None] * len(self.markers)

        def read_row(i: int) -> None:
            values[i] = int(self.markers[i].numpy())

        readers = [threading.Thread(target=read_row, args=(i,), daemon=True) for i in range(len(self.markers))]
        for t in readers:
            t.start()
        deadline = time.monotonic() + answer_s
        for t in readers:  # a reader that never returns is left behind, a daemon
            t.join(max(0.0, deadline - time.monotonic()))
        return decode(started, list(values), self.schedule, self.grad_accum)
