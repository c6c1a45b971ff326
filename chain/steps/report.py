"""A step's report, and running several steps in one call.

A compiled step returns one float32 vector, its *report* (`ReportFormat` says where each value
sits): the step's losses and, per stage, whether the numerics guard dropped its update.
The host reads it once per step, instead of one read per loss and per stage counter.
`repeat` runs N steps in one call of the compiled function (`trainer.steps_per_call`)
and the host reads an [N, size] array once per call: no host round trip between steps, and
with it how long each step waited for its batch (`Reports.waits_ms`, for `data_wait_ms`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np
import tensorflow as tf

from chain.stages.stage import Stage
from chain.steps.ops import copy_to


@dataclass(frozen=True)
class ReportFormat:
    """Where each value sits in a step's report (a float32 vector of `size` values).

    `losses`: mode=local one per stage, mode=e2e the chain's one; `skipped`: one per
    stage, 1.0 when the numerics guard dropped that stage's update in that step; `norm`:
    the chain's global gradient norm (mode=e2e with `optim.clip_global_norm`), else None.
    """

    size: int
    losses: tuple[int, ...]
    skipped: tuple[int, ...]
    norm: int | None = None

    @staticmethod
    def per_stage(n_stages: int) -> "ReportFormat":
        """Stage k reports [loss_k, skipped_k] (mode=local: every stage has its own loss)."""
        return ReportFormat(2 * n_stages, tuple(range(0, 2 * n_stages, 2)), tuple(range(1, 2 * n_stages, 2)))

    @staticmethod
    def chain(n_stages: int, norm: bool = False) -> "ReportFormat":
        """Stage k reports [skipped_k]; the last stage then adds the chain's loss (mode=e2e) and,
        with `norm`, the global norm of the chain's gradients (`chain.steps.clipping`)."""
        return ReportFormat(n_stages + 1 + norm, (n_stages,), tuple(range(n_stages)), n_stages + 1 if norm else None)

    def grad_norm(self, row) -> float | None:
        """One step's global gradient norm from its report row (None when the step reports none)."""
        return None if self.norm is None else float(row[self.norm])

    def decode(self, row) -> tuple[list[float], list[int]]:
        """One step's report (a NumPy row) -> (its losses as floats, indices of the skipped stages)."""
        return [float(row[i]) for i in self.losses], [k for k, i in enumerate(self.skipped) if row[i]]


@dataclass(frozen=True)
class Reports:
    """What one call of the compiled step(s) returns to the host: its steps' reports (`rows`, an
    [m, size] NumPy array, one row per step as `ReportFormat` says) and, per step, the milliseconds the
    step waited for its batch (`waits_ms`: the time in the iterator's get-next, measured where it
    ran: in the graph for steps in one call, on the host for a step per call)."""

    rows: np.ndarray
    waits_ms: tuple[float, ...]


def dropped(flag: tf.Tensor) -> tf.Tensor:
    """The report's skipped value from `apply_update`'s result: 1.0 if the guard dropped the update."""
    return tf.cast(flag, tf.float32)


def report(stages: Sequence[Stage], values: Sequence[Sequence[tf.Tensor]], device: str | None) -> tf.Tensor:
    """The step's report: each stage's scalars `values[k]` stacked on its device, copied to `device`
    (the last stage's: where mode=e2e's loss is) and concatenated there, so the host reads
    one tensor from one device. Stages on `device` need no copy (nor do a mirrored run's,
    which have no device)."""
    parts = []
    for s, vs in zip(stages, values):
        with tf.device(s.device):
            part = tf.stack([tf.cast(v, tf.float32) for v in vs])
        parts.append(part if s.device == device else copy_to(part, device, f"report_s{s.index}"))
    if len(parts) == 1:
        return parts[0]
    with tf.device(device):
        return tf.concat(parts, 0, name="report")


def with_rows(batch: Any, rows: int) -> Any:
    """`batch` (a nest of tensors) with each tensor's first dimension `rows`, checked when it runs
    (`tf.ensure_shape`: a batch of any other size is an error, never reshaped). Composite tensors
    (ragged, sparse) and tensors of unknown rank are left as they are."""

    def fixed(t):
        if not isinstance(t, tf.Tensor) or t.shape.rank is None or t.shape.rank == 0:
            return t
        return tf.ensure_shape(t, [rows, *t.shape[1:]])

    return tf.nest.map_structure(fixed, batch)


def repeat(body: Callable, fmt: ReportFormat, stop_on_skip: bool, examples: int) -> Callable:
    """`steps(iterator, n) -> ([m, fmt.size], [m])`: up to `n` steps of `body(x, ys) -> report`
    in one call, each on the iterator's next batch of `examples` examples (`trainer.steps_per_call`).

    The steps run in a `tf.while_loop`, traced once for any `n` (a Python loop would trace
    N copies: docs/benchmarks-in-code.md). The loop's automatic
    control dependencies make step i+1 (its batch included) start after every stateful op
    of step i, so N steps in one call are N single steps, batch for batch and bit for bit.
    With `stop_on_skip` (trainer.on_nan=stop) the loop ends after the first step in which
    the guard dropped an update: later steps neither run nor take a batch, so the state is
    the state right after that step, as with one step per call; `m` (the rows returned)
    counts the steps that ran. The second array holds each step's wait for its batch, in seconds.

    Each batch is given its `examples` as a static dimension (`with_rows`), which its stream leaves
    unknown: traced on an unknown batch, the step would work out its shapes at run time, every
    step, where one step per call knows them when traced.
    """
    skipped = list(fmt.skipped)

    @tf.function(autograph=False)  # the loop is an explicit tf.while_loop
    def steps(iterator, n):
        def more(i, stop, rows, waits):
            return tf.logical_and(i < n, tf.logical_not(stop))

        def one(i, stop, rows, waits):
            # The host clock around the get-next: an iteration starts after every stateful op of
            # the one before (see above), so this is the time the step waited for its batch.
            # Neither timestamp feeds the step's math.
            start = tf.timestamp()
            with tf.control_dependencies([start]):
                x, ys = with_rows(iterator.get_next(), examples)
            with tf.control_dependencies(tf.nest.flatten((x, ys))):
                wait = tf.timestamp() - start
            row = body(x, ys)
            if stop_on_skip:
                stop = tf.reduce_any(tf.gather(row, skipped) > 0)
            return i + 1, stop, rows.write(i, row), waits.write(i, wait)

        rows = tf.TensorArray(tf.float32, size=0, dynamic_size=True, element_shape=[fmt.size])
        waits = tf.TensorArray(tf.float64, size=0, dynamic_size=True, element_shape=[])
        _, _, rows, waits = tf.while_loop(more, one, (tf.constant(0), tf.constant(False), rows, waits))
        return rows.stack(), waits.stack()

    return steps
