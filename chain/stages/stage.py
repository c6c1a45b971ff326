"""A stage: one Keras model, its head and its optimizer, all living on one device."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable

import keras
import tensorflow as tf

from chain.data.catalog import Target
from chain.planning.devices import canonical
from chain.stages.loss_scale import LossScale


def stage_name(index: int) -> str:
    """`stage_NN`: stage `index`'s model, checkpoint directory, TensorBoard run and export."""
    return f"stage_{index:02d}"


@dataclass(frozen=True)
class SharedCopy:
    """A stage's copy of a weight several stages hold (a tied weight of a model cut into stages):
    `name` is the model's variable path, the same on every stage holding a copy; `variable` is
    this stage's copy, on its device (the tie's rules: `chain.stages.tied_weights`)."""

    name: str
    variable: tf.Variable


@dataclass
class Stage:
    """One stage of the chain, bound to `device`.

    `model` maps the previous stage's output to this stage's output; `head` (mode=local
    only) maps that output to a prediction of `target`. `device` is None in a mirrored
    run, where every replica holds every stage. `loss_scale` (precision=mixed_float16
    only) is the stage's copy of its dynamic loss scale (`chain.stages.loss_scale`).
    `spec` is the stage's validated settings (`chain.config.schema.StageSpec`); `label`
    describes a body that is not the chain's own (a builder, a piece of a cut model).
    `shared`: its copies of weights that other stages hold too (a cut model's tied weights).
    `borrowed`: tied weights this stage's model reads but an earlier stage on the same device owns
    (zbv's first and last stages share device 0; or `placement.devices` names one device twice): one
    variable, not a copy. They are not this stage's `trainable_variables` (its optimizer, checkpoint and
    global norm leave them to the owner); its backward differentiates them too (`gradient_variables`)
    and adds their gradients to the owner's.
    `whole`: for a piece of a cut model, re-creates the uncut model (each tied weight once), which
    the export fills with the stages' trained weights (`chain.state.export`).
    """

    index: int
    device: str | None
    model: keras.Model
    optimizer: keras.optimizers.Optimizer
    target: Target
    head: keras.Model | None = None
    spec: Any = None
    skipped: tf.Variable | None = None
    loss_scale: LossScale | None = None
    label: str | None = None
    shared: tuple[SharedCopy, ...] = ()
    whole: Callable[[], keras.Model] | None = None
    borrowed: tuple[SharedCopy, ...] = ()

    def __post_init__(self) -> None:
        # Updates dropped by the numerics guard. A variable (not a Python int) so the
        # guard can count inside the compiled step and a checkpoint carries the count;
        # created here, inside the caller's device scope, next to the stage's weights.
        if self.skipped is None:
            self.skipped = tf.Variable(0, dtype=tf.int64, trainable=False, name=f"skipped_{self.index:02d}")

    @property
    def trainable_variables(self) -> list[tf.Variable]:
        head = self.head.trainable_variables if self.head is not None else []
        return list(self.model.trainable_variables) + list(head)

    @property
    def gradient_variables(self) -> list[tf.Variable]:
        """What the stage's backward differentiates: its `trainable_variables`, then the `borrowed`
        weights another stage on its device owns (their gradients go to that stage's sums)."""
        return self.trainable_variables + [b.variable for b in self.borrowed]

    @property
    def params(self) -> int:
        return sum(math.prod(v.shape) for v in self.trainable_variables)  # shapes only: no copy to host

    def variable_devices(self) -> list[str]:
        """Sorted unique devices of every model, head and optimizer variable.

        A mirrored variable counts with every replica's copy.
        """
        head = self.head.variables if self.head is not None else []
        variables = list(self.model.variables) + list(head) + list(self.optimizer.variables)
        copies = [
            c
            for v in variables
            for c in (v.value.values if isinstance(v.value, tf.distribute.DistributedValues) else (v.value,))
        ]
        return sorted({canonical(c.device) for c in copies})

    def random_variables(self) -> list[tf.Variable]:
        """The state of every random seed generator (dropout) of the model and head.

        Keras 3 keeps it in `layer.variables` but not in `layer.weights`, and
        `tf.train.Checkpoint(model=...)` does not save it: checkpoints add it explicitly.
        """
        out = []
        for part in (self.model, self.head):
            if part is not None:
                out += random_variables(part)
        return out

    def describe(self) -> str:
        """The stage's body in a few words, e.g. `mlp(width=64, depth=2)`."""
        if self.label:
            return self.label
        return self.spec.model.describe() if self.spec is not None else self.model.name


def random_variables(layer: keras.layers.Layer) -> list[tf.Variable]:
    """Variables of `layer` (and its sublayers) that are random state, not weights."""
    weights = {id(w) for w in layer.weights}
    return [v for v in layer.variables if id(v) not in weights]
