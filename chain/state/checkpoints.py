"""Checkpoints: one directory and one `tf.train.CheckpointManager` per stage, saved all or nothing.

Two managers in one directory share its `checkpoint` index file and restore each
other's steps, so every stage gets its own `stage_NN/` directory; the data stream
(the `tf.data` iterator) gets `data/`. A save writes every stage, then the data
stream, then the run-level manifest `checkpoint.json` (atomically), and only then
deletes checkpoints older than the `keep` newest complete ones. The managers never
delete anything themselves (`max_to_keep=None`): with their own pruning, a save killed
half-way could already have deleted the only step every stage still shares.

A stage's checkpoint holds its model, head, optimizer (with slot variables), the
state of its dropout seed generators (which `tf.train.Checkpoint(model=...)` leaves
out), its count of skipped updates, its loss scale (precision=mixed_float16: scale,
finite steps since it last changed, overflow count) and the step.
"""

from __future__ import annotations

import os
import re
import shutil
from typing import Any, Sequence

import tensorflow as tf

from chain import testhooks
from chain.config.schema import Settings, plain
from chain.errors import ChainError
from chain.stages.stage import Stage, stage_name
from chain.state import manifest as manifest_lib
from chain.state.atomic import write_text

DATA_DIR = "data"
PREFIX = "ckpt"
_NUMBERED = re.compile(rf"^{PREFIX}-(\d+)(\.index|\.data-\d+-of-\d+|_temp)$")


def _write_index(directory: str, steps: Sequence[int]) -> None:
    """Point the directory's `checkpoint` index at exactly `steps` (what the manifest keeps)."""
    names = [f"{PREFIX}-{n}" for n in steps]
    lines = [f'model_checkpoint_path: "{names[-1]}"'] + [f'all_model_checkpoint_paths: "{n}"' for n in names]
    write_text(os.path.join(directory, "checkpoint"), "\n".join(lines) + "\n")


def _prune(directory: str, keep: Sequence[int]) -> None:
    """Delete every numbered checkpoint (and `ckpt-N_temp` leftover) not in `keep`."""
    for entry in os.listdir(directory) if os.path.isdir(directory) else ():
        m = _NUMBERED.match(entry)
        if m and (int(m.group(1)) not in keep or m.group(2) == "_temp"):
            full = os.path.join(directory, entry)
            shutil.rmtree(full) if os.path.isdir(full) else os.remove(full)


class Checkpoints:
    """All-or-nothing checkpoints of a chain and its data stream in one run directory.

    `iterator` is the `tf.data` iterator the run draws batches from: saving it is what
    makes the first batch after a resume the batch the run would have seen.
    """

    def __init__(self, run_dir: str, stages: Sequence[Stage], iterator: Any, settings: Settings):
        self.run_dir = run_dir
        self.stages = list(stages)
        self.settings = settings
        self.keep = settings.checkpoint.keep
        self.parts: dict[str, tf.train.Checkpoint] = {}
        self.steps: dict[str, tf.Variable] = {}
        for s in self.stages:
            with tf.device(s.device):
                step = tf.Variable(0, dtype=tf.int64, trainable=False, name=f"step_{s.index:02d}")
            objects = {"model": s.model, "optimizer": s.optimizer, "random": s.random_variables(),
                       "skipped": s.skipped, "step": step}
            if s.head is not None:
                objects["head"] = s.head
            if s.loss_scale is not None:
                objects["loss_scale"] = s.loss_scale
            self.parts[stage_name(s.index)] = tf.train.Checkpoint(**objects)
            self.steps[stage_name(s.index)] = step
        self.parts[DATA_DIR] = tf.train.Checkpoint(iterator=iterator)

    def directory(self, name: str) -> str:
        return os.path.join(self.run_dir, name)

    def latest(self) -> dict[str, Any] | None:
        """The manifest of the newest complete checkpoint, or None."""
        return manifest_lib.read(self.run_dir)

    def save(self, step: int, loss_first: dict | None, loss_last: dict | None) -> dict[str, Any]:
        """Save every stage and the data stream at `step`, then commit the manifest; returns it."""
        previous = self.latest()
        checkpoints = {}
        for name, ckpt in self.parts.items():
            if name in self.steps:
                self.steps[name].assign(step)
            manager = tf.train.CheckpointManager(ckpt, self.directory(name), max_to_keep=None, checkpoint_name=PREFIX)
            saved = manager.save(checkpoint_number=step)
            checkpoints[name] = os.path.relpath(saved, self.run_dir)
            testhooks.after_part_saved(step, name)
        complete = [n for n in (previous["complete"] if previous else []) if n < step] + [step]
        complete = complete[-self.keep:]
        m = {
            "format": manifest_lib.FORMAT,
            "step": step,
            "complete": complete,
            "mode": self.settings.mode,
            "seed": self.settings.seed,
            "data": plain(self.settings.data),
            "grad_accum": self.settings.trainer.grad_accum,
            "precision": self.settings.precision,
            "stages": manifest_lib.layout(self.stages),
            "checkpoints": checkpoints,
            "loss_first": loss_first,
            "loss_last": loss_last,
        }
        manifest_lib.write(self.run_dir, m)  # the commit point
        self.clean(m)
        return m

    def clean(self, m: dict[str, Any]) -> None:
        """Remove what the manifest does not name: older steps, half-written steps, `_temp` folders."""
        for name in self.parts:
            directory = self.directory(name)
            _prune(directory, m["complete"])
            if os.path.isdir(directory):
                _write_index(directory, m["complete"])

    def restore(self, clean: bool = True) -> dict[str, Any]:
        """Restore the newest complete checkpoint into the built stages and the data stream.

        Checks the manifest's layout against the built chain first (one line naming
        the stage and variable on a mismatch), then restores each part with
        `assert_consumed`, so nothing is ever restored partially. With `clean`, then
        removes what the manifest does not name (steps of a save that was killed,
        `ckpt-N_temp` folders). Returns the manifest.
        """
        m = self.latest()
        if m is None:
            raise ChainError(
                f"resume=true, but {self.run_dir} has no complete checkpoint ({manifest_lib.FILENAME} is missing); "
                "point hydra.run.dir at a run that saved one, or drop resume=true to start a new run"
            )
        manifest_lib.check_layout(m["stages"], manifest_lib.layout(self.stages))
        manifest_lib.check_stream(m, self.settings)
        for name, ckpt in self.parts.items():
            where = m["checkpoints"].get(name)
            if where is None:
                raise ChainError(f"{manifest_lib.FILENAME} names no checkpoint for {name}")
            full = os.path.join(self.run_dir, where)
            if not os.path.exists(f"{full}.index"):
                raise ChainError(f"{where}, named by {manifest_lib.FILENAME} (step {m['step']}), is missing")
            try:
                ckpt.restore(full).assert_consumed()
            except AssertionError as e:
                first = str(e).strip().splitlines()[0]
                raise ChainError(f"{where} does not match the built chain ({name}): {first}") from None
            if name in self.steps and int(self.steps[name].numpy()) != m["step"]:
                raise ChainError(f"{where} holds step {int(self.steps[name].numpy())}, but "
                                 f"{manifest_lib.FILENAME} says step {m['step']}")
        if clean:
            self.clean(m)
        return m
