"""What a run shows and records: the placement table and TensorBoard writers."""

from __future__ import annotations

import os
from typing import Sequence

from chain.planning.planner import Assignment
from chain.records.summaries import Ranked
from chain.stages.stage import Stage, stage_name
from chain.state.atomic import writing


def _table(rows: Sequence[Sequence[str]]) -> list[str]:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]


def assignment_table(
    assignment: Assignment, stages: Sequence[Stage], notes: Sequence[str] = (), unit: str = "stage"
) -> str:
    """A short table: stage, device, the physical device behind it, parameters, model; then
    the placement's notes and `notes`, one `note:` line each. `unit` heads the first column
    (`variant` side by side, whose models are not stages of a chain).

    A mirrored run shows its replicas (device and physical device) first; each stage
    then lives on every replica. Copies of a pipeline show their grid (replica x stage ->
    device) first; the stage rows are replica 0's.
    """
    lines = []
    if assignment.mirrored_devices:
        lines += _table(
            [("replica", "device", "physical")]
            + [(str(i), d, assignment.physical.get(d, "-")) for i, d in enumerate(assignment.mirrored_devices)]
        )
    if len(assignment.copies) > 1:  # copies of the pipeline: replica x stage -> device
        lines += _table(
            [("replica", *(f"stage {k}" for k in range(len(assignment.copies[0]))))]
            + [(str(r), *row) for r, row in enumerate(assignment.copies)]
        )
    rows = [(unit, "device", "physical", "params", "model")]
    for s in stages:
        device = s.device or f"all {len(assignment.mirrored_devices)} replicas"
        rows.append((str(s.index), device, assignment.physical.get(s.device, "-"), f"{s.params:,}", s.describe()))
    lines += _table(rows)
    lines += [f"note: {n}" for n in [*assignment.notes, *notes]]
    return "\n".join(lines)


def ranking_table(ranking: Sequence[Ranked]) -> str:
    """mode=side_by_side: the variants, best first, with their metric, speed and peak memory."""
    rows = [("rank", "variant", "metric", "value", "steps/s", "peak memory")]
    for r in ranking:
        value = "paused" if r.paused else ("-" if r.value is None else f"{r.value:.4f}")
        speed = "-" if r.steps_per_second is None else f"{r.steps_per_second:.1f}"
        memory = "-" if r.peak_memory_bytes is None else f"{r.peak_memory_bytes / 2**20:.1f} MiB"
        rows.append((str(r.rank), r.variant, r.metric, value, speed, memory))
    return "\n".join(_table(rows))


class Writers:
    """One TensorBoard writer per stage (`tb/stage_NN`) and one for the chain (`tb/chain`).

    A write that fails (disk full, read-only) raises a one-line `StorageError`.
    """

    def __init__(self, run_dir: str, n_stages: int):
        import tensorflow as tf

        self.root = os.path.join(run_dir, "tb")
        with writing(f"TensorBoard logs in {self.root}"):
            os.makedirs(self.root, exist_ok=True)
            self.stages = [
                tf.summary.create_file_writer(os.path.join(self.root, stage_name(k))) for k in range(n_stages)
            ]
            self.chain = tf.summary.create_file_writer(os.path.join(self.root, "chain"))

    def scalars(self, step: int, per_stage: Sequence[dict[str, float]], chain: dict[str, float]) -> None:
        """Write `per_stage[k]` to stage k's writer and `chain` to the chain's."""
        import tensorflow as tf

        with writing(f"TensorBoard logs in {self.root}"):
            for writer, values in zip(self.stages, per_stage):
                with writer.as_default(step=step):
                    for name, v in values.items():
                        tf.summary.scalar(name, v)
            with self.chain.as_default(step=step):
                for name, v in chain.items():
                    tf.summary.scalar(name, v)

    def flush(self) -> None:
        """Write what is buffered (at a checkpoint: a run killed later keeps its curves up to there,
        and its resume logs the steps after it again)."""
        with writing(f"TensorBoard logs in {self.root}"):
            for w in self.stages + [self.chain]:
                w.flush()

    def close(self) -> None:
        with writing(f"TensorBoard logs in {self.root}"):
            for w in self.stages + [self.chain]:
                w.close()
