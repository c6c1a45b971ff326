"""A chain's state by what it is, not by the stage that holds it: what lets a run resume on another layout.

Every stage's checkpoint holds, besides its model and optimizer, one mapping (`KEY`) of the same
variables by a name that does not depend on the split:

    w{n}/weight    the chain's n-th weight: stage after stage, each stage's model weights in order (a later
                   copy of a tied weight, or one borrowed from another stage, is not counted: the first
                   holder's is the weight)
    w{n}/{slot}    its optimizer slots (Keras' slot lists, e.g. `momentums`)
    h{n}:{target}  mode=local: the head at the stage boundary after the chain's first n weights that learns
                   `target`, `w{i}/weight` and `w{i}/{slot}` for its i-th weight

The dropout seed states are read from each stage's `random` list (stage after stage, the chain's order).
A model cut into 2 stages and the same model cut into 4 number their weights alike (the cut keeps the
model's layer order), so a checkpoint of one restores into the other weight by weight (`restore`):
each built stage takes its keys from whichever saved stages hold them; a counter takes the largest
count among the saved stages (they are equal unless `trainer.on_nan=skip` dropped updates), a loss
scale the smallest scale (the one that overflowed last): the optimizer's iterations, the skipped
updates and the loss scale (`COUNTERS`) keep the keys they always had. The checkpoint files name the
keys each stage holds (its object graph), so nothing else is trusted for it.

The chain's own `mlp`/`conv` stages regroup the same way (4 stages of model.depth=2 into 2 of
model.depth=4): their layers are numbered alike too. A head (mode=local) is kept where both layouts end a
stage at the same weight and it learns the same target; a head at a boundary that is new starts as built
(seeded, its optimizer state zero), and one at a boundary that went is dropped (`Regrouped` says which).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import tensorflow as tf

from chain.errors import CheckpointError, first_line
from chain.internals.keras_private import built_for, slot_lists
from chain.internals.tf_private import checkpoint_children
from chain.stages.stage import Stage
from chain.stages.tied_weights import pairs

# Each stage part's child holding its weights by layer identity: after the part's other children in TensorFlow's
# order of names, and a level deeper than the optimizer's slots, so that it never becomes a variable's shortest path
# (which names it in the file): a stage's checkpoint keys stay what they were.
KEY = "~by_layer"
# The stage's counters, by the checkpoint keys every stage part has always written them under (outside `KEY`, so
# those keys stay): read from each saved stage and combined, the largest count, the smallest loss scale.
COUNTERS = {
    "iterations": "optimizer/_iterations",
    "skipped": "skipped",
    "scale": "loss_scale/scale",
    "good_steps": "loss_scale/good_steps",
    "overflows": "loss_scale/overflows",
}
RANDOM = "random"  # each stage part's list of its dropout seed states, in the chain's order (`Stage.random_variables`)
_VALUE = "/.ATTRIBUTES/VARIABLE_VALUE"


def _counters(stage: Stage) -> dict[str, tf.Variable]:
    out = {"iterations": stage.optimizer.iterations, "skipped": stage.skipped}
    if stage.loss_scale is not None:
        ls = stage.loss_scale
        out.update({"scale": ls.scale, "good_steps": ls.good_steps, "overflows": ls.overflows})
    return out


HEAD = "h"  # a head's key: `h{n}:{target}`


@dataclass(frozen=True)
class Regrouped:
    """What a restore into another layout did with the heads (mode=local): `kept` maps a built stage to
    the saved stage whose head it took, `new` the built stages whose head starts as built, `dropped` the
    saved stages whose head has no boundary left."""

    kept: dict[int, int] = field(default_factory=dict)
    new: list[int] = field(default_factory=list)
    dropped: list[int] = field(default_factory=list)

    def lines(self, saved: str = "the checkpoint's stage") -> list[str]:
        """One line per head that moved, was made or went (`saved`: how the stages saved are named)."""
        out = [
            f"stage {k}: head of {saved} {self.kept[k]} kept"
            if k in self.kept
            else f"stage {k}: new head, fresh weights and optimizer state"
            for k in sorted([*self.kept, *self.new])
        ]
        if self.dropped:
            out.append(f"heads of {saved}s {', '.join(map(str, self.dropped))} dropped (no longer at a stage boundary)")
        return out


def _with_slots(v: tf.Variable, slots: dict[str, list], index: dict[int, int]) -> dict[str, tf.Variable]:
    held = {"weight": v}
    for kind, variables in slots.items() if id(v) in index else ():
        held[kind.strip("_")] = variables[index[id(v)]]
    return held


def keyed(stages: Sequence[Stage]) -> list[dict[str, dict]]:
    """Each stage's weights by layer identity (`w{n}`), each with its slots (`weight`, then Keras' slot
    names without their underscore, e.g. `momentums`), and its head (`h{n}:{target}`), in stage order."""
    seen = {id(c) for c, _ in pairs(stages)}  # a later copy: its first holder's is the weight
    out, n = [], 0
    for s in stages:
        slots = slot_lists(s.optimizer)
        index = {id(v): i for i, v in enumerate(built_for(s.optimizer))}
        held: dict[str, dict] = {}
        for v in s.model.weights:
            if id(v) in seen:  # ... or a weight borrowed from an earlier stage on the same device
                continue
            seen.add(id(v))
            held[f"w{n}"] = _with_slots(v, slots, index)
            n += 1
        if s.head is not None:
            held[f"{HEAD}{n}:{s.target.name}"] = {
                f"w{i}": _with_slots(v, slots, index) for i, v in enumerate(s.head.weights)
            }
        out.append(held)
    return out


def unkeyed(stage: Stage) -> list[str]:
    """The optimizer variables of `stage` that no key names (state a restore by layer would drop)."""
    known = {id(v) for variables in slot_lists(stage.optimizer).values() for v in variables}
    known |= {id(stage.optimizer.iterations), id(stage.optimizer.learning_rate)}
    return [v.path for v in stage.optimizer.variables if id(v) not in known]


def _read(prefix: str, variables: dict[str, dict[str, tf.Variable]]) -> None:
    try:
        tf.train.Checkpoint(**{KEY: variables}).restore(prefix).assert_existing_objects_matched().expect_partial()
    except (AssertionError, ValueError, tf.errors.OpError) as e:
        raise CheckpointError(f"{prefix} does not restore into this layout: {first_line(e)}") from None


def _weights(keys: set[str]) -> set[str]:
    return {k for k in keys if not k.startswith(HEAD)}


def _check_keys(held: dict[str, set[str]], wanted: list[dict[str, dict]]) -> None:
    saved, built = _weights(set().union(*held.values())), _weights(set().union(*wanted))
    if saved != built:
        key = min(saved ^ built, key=lambda k: (len(k), k))
        where = "in the checkpoint but not in the config" if key in saved else "in the config but not in the checkpoint"
        raise CheckpointError(
            f"the checkpoint holds {len(saved)} weights of a chain by layer, the config builds {len(built)} ({key} is {where}): "
            "a resume on another layout needs the same model"
        )


def restore(prefixes: dict[str, str], stages: Sequence[Stage]) -> Regrouped:
    """Restore `stages` from the stage checkpoints `prefixes` (part name -> checkpoint prefix) of
    another layout, key by key; a CheckpointError (one line) when their weights differ. Returns what
    became of the heads."""
    for s in stages:
        if unkeyed(s):
            raise CheckpointError(
                f"stage {s.index}'s optimizer keeps state chain cannot place on another layout "
                f"({', '.join(unkeyed(s))}); resume with the layout the checkpoint was written with"
            )
    held = {name: set(checkpoint_children(prefix, KEY)) for name, prefix in prefixes.items()}
    if not all(held.values()):
        raise CheckpointError(
            "the checkpoint was written before checkpoints kept a chain's state by layer: resume it with "
            "the stages and split it was written with"
        )
    wanted = keyed(stages)
    _check_keys(held, wanted)
    regrouped = Regrouped()
    for s, variables in zip(stages, wanted):
        for name, prefix in prefixes.items():
            found = {k: v for k, v in variables.items() if k in held[name]}
            if found:
                _read(prefix, found)
            if set(found) - _weights(set(found)):  # the head at this boundary, for this target
                regrouped.kept[s.index] = _index(name)
        if s.head is not None and s.index not in regrouped.kept:
            regrouped.new.append(s.index)
    regrouped.dropped.extend(
        sorted(
            _index(n) for n, keys in held.items() if keys - _weights(keys) and _index(n) not in regrouped.kept.values()
        )
    )
    readers = [tf.train.load_checkpoint(prefixes[name]) for name in sorted(prefixes)]
    for s in stages:
        _restore_counters(readers, _counters(s))
    _restore_random(readers, [v for s in stages for v in s.random_variables()])
    return regrouped


def _index(part: str) -> int:
    """The stage index of a stage part's name (`stage_03` -> 3)."""
    return int(part.rpartition("_")[2])


def _restore_random(readers: list, variables: list[tf.Variable]) -> None:
    """The chain's dropout seed states, in order: the saved stages' `random` lists one after another."""
    saved = []
    for r in readers:
        i = 0
        while r.has_tensor(f"{RANDOM}/{i}{_VALUE}"):
            saved.append((r, f"{RANDOM}/{i}{_VALUE}"))
            i += 1
    if len(saved) != len(variables):
        raise CheckpointError(
            f"the checkpoint holds {len(saved)} dropout seed states, the config builds {len(variables)}: "
            "a resume on another layout needs the same model"
        )
    for (r, key), v in zip(saved, variables):
        v.assign(r.get_tensor(key))


def _restore_counters(readers: list, counters: dict[str, tf.Variable]) -> None:
    """A stage's counters from every saved stage: the largest count; the smallest loss scale, with its
    count of good steps."""
    read = [
        {k: r.get_tensor(COUNTERS[k] + _VALUE) for k in counters if r.has_tensor(COUNTERS[k] + _VALUE)} for r in readers
    ]
    for k in ("iterations", "skipped", "overflows"):
        values = [r[k] for r in read if k in r]
        if k in counters and values:
            counters[k].assign(max(values))
    scales = [r for r in read if "scale" in r]
    if "scale" in counters and scales:
        smallest = min(scales, key=lambda r: r["scale"])
        counters["scale"].assign(smallest["scale"])
        counters["good_steps"].assign(smallest["good_steps"])
