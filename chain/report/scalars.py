"""A run's TensorBoard scalars, read back from its event files (`tb/stage_NN`, `tb/chain`).

A resumed run opens a second event file per writer and logs again the steps after its
checkpoint, which the killed run may have logged already. Files are read oldest first
(by their first event's time); when a later file logs a tag from step s on, the earlier
points of that tag at steps >= s are dropped (what TensorBoard does with "orphaned" points
after a restart): one continuous curve per tag, one point per step.
"""

from __future__ import annotations

import glob
import os

Series = list[tuple[int, float]]  # (step, value), by step


def _events(path: str):
    from tensorboard.backend.event_processing.event_file_loader import EventFileLoader

    return EventFileLoader(path).Load()


def _value(v) -> float | None:
    from tensorboard.util import tensor_util

    if v.HasField("tensor"):
        array = tensor_util.make_ndarray(v.tensor)
        return float(array) if array.size == 1 else None
    return float(v.simple_value) if v.HasField("simple_value") else None


def read_file(path: str) -> tuple[float, dict[str, dict[int, float]]]:
    """(the file's first event time, {tag: {step: value}}) of one event file (the last value of a step wins)."""
    first, tags = None, {}
    for event in _events(path):
        first = event.wall_time if first is None else first
        for v in event.summary.value:
            value = _value(v)
            if value is not None:
                tags.setdefault(v.tag, {})[int(event.step)] = value
    return (first if first is not None else 0.0), tags


def merge(files: list[dict[str, dict[int, float]]]) -> dict[str, Series]:
    """Tags of event files, oldest first, merged: each file's points replace the earlier files'
    points of the same tag from its first step on."""
    out: dict[str, dict[int, float]] = {}
    for tags in files:
        for tag, points in tags.items():
            if not points:
                continue
            since = min(points)
            kept = {s: v for s, v in out.get(tag, {}).items() if s < since}
            out[tag] = {**kept, **points}
    return {tag: sorted(points.items()) for tag, points in out.items()}


def read_writer(directory: str) -> dict[str, Series]:
    """Every scalar tag of one writer's directory, its event files merged."""
    files = [read_file(p) for p in glob.glob(os.path.join(directory, "events.out.tfevents.*"))]
    return merge([tags for _, tags in sorted(files, key=lambda f: f[0])])


def read_run(run_dir: str) -> dict[str, dict[str, Series]]:
    """{writer: {tag: series}} for every writer under `run_dir/tb` (`stage_00`, ..., `chain`)."""
    root = os.path.join(run_dir, "tb")
    if not os.path.isdir(root):
        return {}
    return {
        name: read_writer(os.path.join(root, name))
        for name in sorted(os.listdir(root))
        if os.path.isdir(os.path.join(root, name))
    }
