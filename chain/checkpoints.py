"""Checkpoints: one directory and one `tf.train.CheckpointManager` per stage.

Two managers in one directory share its `checkpoint` index file and restore each
other's steps, so every stage gets its own `stage_NN/` directory.
"""

from __future__ import annotations

import os
from typing import Sequence

import tensorflow as tf

from chain.stages import Stage


def stage_dir(run_dir: str, index: int) -> str:
    """The checkpoint directory of stage `index`."""
    return os.path.join(run_dir, f"stage_{index:02d}")


class Checkpoints:
    """Per-stage checkpoint managers for one run directory."""

    def __init__(self, run_dir: str, stages: Sequence[Stage], keep: int):
        self.managers = []
        for s in stages:
            parts = {"model": s.model, "optimizer": s.optimizer}
            if s.head is not None:
                parts["head"] = s.head
            ckpt = tf.train.Checkpoint(**parts)
            self.managers.append(tf.train.CheckpointManager(ckpt, stage_dir(run_dir, s.index), max_to_keep=keep))

    def save(self, step: int) -> None:
        """Save every stage at `step` (checkpoint number = step)."""
        for m in self.managers:
            m.save(checkpoint_number=step)
