"""A tied weight in checkpoints, saved once by its first holder: the checkpoint's side of the rule
(`chain.stages.tied_weights`, which pairs every later copy and slot with the first holder's).

The later copies and their slots stay in the later stages' checkpoint objects (their object graph
is unchanged) but write no value (`leave_out`); a restore assigns them the first holder's restored
values (`take_from_first`), which are exactly the values they had. A checkpoint written before this
(with every copy's value saved) still restores: the later copies then take the first holder's values
too, which were equal to their own.
"""

from __future__ import annotations

from typing import Any, Sequence

import tensorflow as tf

from chain.stages.stage import Stage
from chain.stages.tied_weights import pairs


class _Unsaved:
    """Mixed into a later copy's class: it is in the checkpoint's object graph, with no value."""

    def _serialize_to_tensors(self) -> dict[str, Any]:
        return {}

    def _restore_from_tensors(self, restored_tensors: dict[str, Any]) -> None:
        return None


_CLASSES: dict[type, type] = {}


def _unsaved(variable: tf.Variable) -> None:
    cls = type(variable)
    if issubclass(cls, _Unsaved):
        return
    if cls not in _CLASSES:
        _CLASSES[cls] = type(f"Unsaved{cls.__name__}", (_Unsaved, cls), {})
    variable.__class__ = _CLASSES[cls]  # same layout, only the checkpoint hooks differ


def leave_out(stages: Sequence[Stage]) -> None:
    """Make every later copy of a tied weight, and its slots, write no value into a checkpoint.
    Build the optimizers first (their slots must exist)."""
    for copy, _ in pairs(stages):
        _unsaved(copy)


def take_from_first(stages: Sequence[Stage]) -> None:
    """After a restore: every later copy and slot takes its first holder's value (copied to its device)."""
    for copy, first in pairs(stages):
        copy.assign(first.value)
