"""A tied weight in checkpoints: saved once, by its first holder.

A model cut into stages keeps one copy of a tied weight on every stage using it
(`chain.steps.tied`); the copies take the same summed gradient and each stage's optimizer
applies it with slots that started equal, so the copies and their slots stay equal bit for
bit. A checkpoint therefore holds the weight (and its slots) once: in the first holder's
stage. The later copies and their slots stay in the later stages' checkpoint objects (their
object graph is unchanged) but write no value (`leave_out`); a restore assigns them the first
holder's restored values (`take_from_first`), which are exactly the values they had.

A checkpoint written before this (with every copy's value saved) still restores: the later
copies then take the first holder's values too, which were equal to their own.
The slots are paired by Keras' slot names, so the stages holding a tied weight need the same
optimizer (with different ones the copies would not stay equal anyway).
"""

from __future__ import annotations

from typing import Any, Sequence

import tensorflow as tf

from chain.errors import CheckpointError
from chain.stages.stage import Stage
from chain.steps.tied import groups


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


def _slots(stage: Stage) -> dict[int, dict[str, tf.Variable]]:
    """id(trainable variable) -> its optimizer slots by name (`momentum`, ...). Keras names a slot
    `OPTIMIZER/{variable path with _}_{slot}`; the longest variable prefix decides the owner."""
    prefixes = {v.path.replace("/", "_") + "_": id(v) for v in stage.trainable_variables}
    out: dict[int, dict[str, tf.Variable]] = {}
    for slot in stage.optimizer.variables:
        local = slot.path.split("/", 1)[-1]
        owners = [p for p in prefixes if local.startswith(p)]
        if owners:
            best = max(owners, key=len)
            out.setdefault(prefixes[best], {})[local[len(best) :]] = slot
    return out


def pairs(stages: Sequence[Stage]) -> list[tuple[tf.Variable, tf.Variable]]:
    """(later copy, first holder's variable) for every later copy of a tied weight and every slot
    of it in its stage's optimizer, the slot paired with the first holder's slot of that name."""
    out = []
    slots = {s.index: _slots(s) for s in stages}
    for name, group in groups(stages).items():
        k0, i0 = group[0]
        first = stages[k0].trainable_variables[i0]
        first_slots = slots[k0].get(id(first), {})
        for k, i in group[1:]:
            copy = stages[k].trainable_variables[i]
            out.append((copy, first))
            for slot, v in slots[k].get(id(copy), {}).items():
                if slot not in first_slots:
                    raise CheckpointError(
                        f"stage {k}'s optimizer has a slot {slot!r} for the tied weight {name!r} "
                        f"that stage {k0}'s optimizer lacks: give the stages holding it the same "
                        "optimizer"
                    )
                out.append((v, first_slots[slot]))
    return out


def leave_out(stages: Sequence[Stage]) -> None:
    """Make every later copy of a tied weight, and its slots, write no value into a checkpoint.
    Build the optimizers first (their slots must exist)."""
    for copy, _ in pairs(stages):
        _unsaved(copy)


def take_from_first(stages: Sequence[Stage]) -> None:
    """After a restore: every later copy and slot takes its first holder's value (copied to its device)."""
    for copy, first in pairs(stages):
        copy.assign(first.value)
