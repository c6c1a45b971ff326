"""Tied weights: a weight several stages of a cut model use. The rules, in one place.

A tied weight is a variable two layers of the model hold (an embedding's matrix reused as the
read-out's projection; a layer called twice; a layer inside an earlier one that the model calls
again). Its *first holder* is the first layer holding it (`first_holders`).

**Who holds, who borrows.** Once the stages are placed on devices, the stage whose layers include the
first holder is the weight's *home* (`Holders`, resolved before any stage is built, from the cut and the
devices alone). A later stage using the weight on the home's device *borrows* the home's layer itself
(one variable: `Stage.borrowed`); one on another device holds a *copy* of it, made on its device from the
model's values (`Stage.shared`). The one layer object a home lends is made by whichever of its stages is
built first, by one recipe, so the stages may be built in any order, alone or again.

**How the copies stay equal.** Every copy starts from the model's values. The pipeline step sums the
copies' gradients on the first holder's device and gives every copy that sum (`chain.steps.tied`, over
`groups`); each stage's optimizer, whose slots started equal too, applies it, so the copies and their
slots stay equal bit for bit. A borrower's gradient joins the home's sums. The global norm counts the
weight once (`later_copies`). A strategy whose step does not sum (mode=local) refuses a weight that two
stages use (`users`).

**How a checkpoint saves it once.** A checkpoint holds the weight (and its slots) once, in the first
holder's stage; every later copy and its slots is paired with the first holder's (`pairs`), written with
no value and given the first holder's on restore (`chain.state.tied_copies`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Iterable, Mapping, Sequence

import keras
import tensorflow as tf

from chain.errors import CheckpointError
from chain.stages.stage import Stage


def first_holders(layers: Sequence[keras.layers.Layer]) -> dict[int, int]:
    """id(variable) -> the index of the first layer holding it, for every variable two layers hold
    (a tied weight, e.g. an embedding whose matrix a custom read-out layer also uses)."""
    owner: dict[int, int] = {}
    tied: dict[int, int] = {}
    for i, layer in enumerate(layers):
        for v in layer.weights:
            first = owner.setdefault(id(v), i)
            if first != i:
                tied[id(v)] = first
    return tied


@dataclass(frozen=True)
class Holders:
    """Where the first holders of a cut model's tied weights live once its stages are placed.

    `home[o]`: the stage whose layers include layer o (a first holder); `devices[k]`: stage k's device
    (None: placed by a tf.distribute strategy, never lends). Stage k borrows layer o when it is on o's
    home's device (and is not its home); otherwise it copies it. `_lent` keeps the one layer object a
    home lends, made by whichever stage sharing it is built first."""

    home: Mapping[int, int]
    devices: tuple[str | None, ...]
    _lent: dict[int, keras.layers.Layer] = field(default_factory=dict, compare=False, repr=False)

    @classmethod
    def placed(cls, owners: Iterable[int], layers: Mapping[int, range], devices: Sequence[str | None]) -> Holders:
        """Where first holders `owners` (layer indices) live when stage k holds the model's `layers[k]` on
        `devices[k]` (canonical): each one's home is the stage holding it."""
        home = {o: k for k, held in layers.items() for o in owners if o in held}
        return cls(home, tuple(devices))

    def borrows(self, stage: int, owner: int) -> bool:
        """Whether stage `stage` reads layer `owner`'s home's layer itself (one variable on one device)."""
        home = self.home.get(owner)
        return (
            home not in (None, stage) and self.devices[stage] is not None and self.devices[stage] == self.devices[home]
        )

    def lent(self, owner: int) -> bool:
        """Whether a stage borrows layer `owner` from its home."""
        return any(self.borrows(k, owner) for k in range(len(self.devices)))

    def layer(self, owner: int, make: Callable[[], keras.layers.Layer]) -> keras.layers.Layer:
        """The one layer object for lent layer `owner`: made by `make` (inside the home's device scope, where
        the first stage sharing it is built) on first use, the same object for its home and its borrowers."""
        if owner not in self._lent:
            self._lent[owner] = make()
        return self._lent[owner]


def groups(stages: Sequence[Stage]) -> dict[str, list[tuple[int, int]]]:
    """Each weight held by two or more stages (by its path in the model) -> its copies' (stage index,
    position in that stage's `trainable_variables`), first holder first."""
    found: dict[str, list[tuple[int, int]]] = {}
    for s in stages:
        position = {id(v): i for i, v in enumerate(s.trainable_variables)}
        for copy in s.shared:
            if id(copy.variable) in position:
                found.setdefault(copy.name, []).append((s.index, position[id(copy.variable)]))
    return {name: g for name, g in found.items() if len(g) > 1}


def later_copies(stages: Sequence[Stage]) -> set[tuple[int, int]]:
    """The copies after each weight's first: left out of the global norm, which counts a weight once."""
    return {c for g in groups(stages).values() for c in g[1:]}


def owner_of(stages: Sequence[Stage], variable: tf.Variable) -> tuple[int, int]:
    """(stage index, position in its `trainable_variables`) of the stage holding a borrowed `variable`."""
    return next((s.index, i) for s in stages for i, v in enumerate(s.trainable_variables) if v is variable)


def users(stages: Sequence[Stage]) -> dict[str, list[int]]:
    """Each weight two or more stages use (by its path in the model) -> those stages, first holder first:
    the holders of its copies and the stages borrowing it."""
    found = {name: [k for k, _ in g] for name, g in groups(stages).items()}
    for s in stages:
        for b in s.borrowed:
            found.setdefault(b.name, [owner_of(stages, b.variable)[0]]).append(s.index)
    return found


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
    of it in its stage's optimizer, the slot paired with the first holder's slot of that name.
    The slots are paired by Keras' slot names, so the stages holding a tied weight need the same
    optimizer (with different ones the copies would not stay equal anyway)."""
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
