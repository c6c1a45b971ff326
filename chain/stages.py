"""Stages: one Keras model, its head and its optimizer, all created on one device.

Layers are the unit of a stage's model (a stage is a group of layers), so a chain can
be cut differently later. Everything with state is created inside
`tf.device(stage.device)`, and the optimizer is built eagerly there: built lazily in the
first traced step, Keras 3 would put every slot variable on one device.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import keras
import tensorflow as tf

from chain import precision
from chain.data import Target
from chain.errors import ConfigError
from chain.loss_scale import LossScale
from chain.planner import canonical


def stage_name(index: int) -> str:
    """`stage_NN`: stage `index`'s model, checkpoint directory, TensorBoard run and export."""
    return f"stage_{index:02d}"


@dataclass
class Stage:
    """One stage of the chain, bound to `device`.

    `model` maps the previous stage's output to this stage's output; `head` (mode=local
    only) maps that output to a prediction of `target`. `device` is None in a mirrored
    run, where every replica holds every stage. `loss_scale` (precision=mixed_float16
    only) is the stage's copy of its dynamic loss scale (`chain.loss_scale`).
    """

    index: int
    device: str | None
    model: keras.Model
    optimizer: keras.optimizers.Optimizer
    target: Target
    head: keras.Model | None = None
    spec: dict | None = None
    skipped: tf.Variable | None = None
    loss_scale: LossScale | None = None

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
    def params(self) -> int:
        return sum(math.prod(v.shape) for v in self.trainable_variables)  # shapes only: no copy to host

    def variable_devices(self) -> list[str]:
        """Sorted unique devices of every model, head and optimizer variable.

        A mirrored variable counts with every replica's copy.
        """
        head = self.head.variables if self.head is not None else []
        variables = list(self.model.variables) + list(head) + list(self.optimizer.variables)
        copies = [c for v in variables
                  for c in (v.value.values if isinstance(v.value, tf.distribute.DistributedValues) else (v.value,))]
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
        m = self.spec["model"] if self.spec else {}
        keys = ("width", "depth") if m.get("name") == "mlp" else ("filters", "depth", "kernel_size")
        return f"{m.get('name', '?')}(" + ", ".join(f"{k}={m[k]}" for k in keys if k in m) + ")"


def random_variables(layer: keras.layers.Layer) -> list[tf.Variable]:
    """Variables of `layer` (and its sublayers) that are random state, not weights."""
    weights = {id(w) for w in layer.weights}
    return [v for v in layer.variables if id(v) not in weights]


def model_layers(spec: dict[str, Any], input_shape: tuple[int, ...], where: str,
                 dtype: keras.DTypePolicy | str | None = None) -> list[keras.layers.Layer]:
    """The layers of one stage's body, from its validated `model` section.

    `dtype` is every layer's dtype policy (`chain.precision`); None: the global policy.
    """
    layers: list[keras.layers.Layer] = []
    act = None if spec["activation"] == "linear" else spec["activation"]
    if spec["name"] == "conv":
        if len(input_shape) != 3:
            raise ConfigError(
                f"{where}.model=conv needs image input (height, width, channels), but receives shape {input_shape}; "
                "put conv stages first and use data=digits"
            )
        for _ in range(spec["depth"]):
            layers.append(keras.layers.Conv2D(spec["filters"], spec["kernel_size"], padding="same", activation=act,
                                              dtype=dtype))
            if spec["dropout"]:
                layers.append(keras.layers.Dropout(spec["dropout"], dtype=dtype))
        return layers
    if len(input_shape) > 1:
        layers.append(keras.layers.Flatten(dtype=dtype))
    for _ in range(spec["depth"]):
        layers.append(keras.layers.Dense(spec["width"], activation=act, dtype=dtype))
        if spec["dropout"]:
            layers.append(keras.layers.Dropout(spec["dropout"], dtype=dtype))
    return layers


def output_layers(target: Target, input_shape: tuple[int, ...]) -> list[keras.layers.Layer]:
    """A linear read-out of `target`: logits for classes, one unit for a value; always float32."""
    policy = precision.readout_policy()
    flat = [keras.layers.Flatten(dtype=policy)] if len(input_shape) > 1 else []
    return flat + [keras.layers.Dense(target.classes or 1, dtype=policy)]


def make_optimizer(spec: dict[str, Any], name: str | None = None) -> keras.optimizers.Optimizer:
    """A Keras optimizer from a validated `optim` section."""
    if spec["name"] == "sgd":
        return keras.optimizers.SGD(learning_rate=spec["lr"], momentum=spec["momentum"], name=name)
    return keras.optimizers.Adam(learning_rate=spec["lr"], beta_1=spec["beta_1"], beta_2=spec["beta_2"], name=name)


def build_stages(settings: dict[str, Any], devices: list[str | None], input_shape: tuple[int, ...], targets) -> list[Stage]:
    """Create every stage's model, head and optimizer inside its device scope.

    `targets(name)` resolves a target name to a `Target`. In mode=e2e the last stage
    ends in a read-out of the chain's target; in mode=local every stage gets a head.
    Body layers compute in `settings["precision"]` (read-outs in float32); under
    mixed_float16 each stage also gets its `LossScale`, created on its device.
    """
    specs = settings["stages"]
    policy = precision.body_policy(settings["precision"])
    scaled = precision.needs_loss_scale(settings["precision"])
    stages = []
    shape = tuple(input_shape)
    for k, (spec, device) in enumerate(zip(specs, devices)):
        where = f"stages[{k}]"
        target = targets(spec["target"])
        with tf.device(device):
            model = keras.Sequential([keras.Input(shape)] + model_layers(spec["model"], shape, where, policy),
                                     name=stage_name(k))
            head = None
            if settings["mode"] == "e2e" and k == len(specs) - 1:
                for layer in output_layers(target, tuple(model.output_shape[1:])):
                    model.add(layer)
            out_shape = tuple(model.output_shape[1:])
            if settings["mode"] == "local":
                head = keras.Sequential([keras.Input(out_shape)] + output_layers(target, out_shape), name=f"head_{k:02d}")
            optimizer = make_optimizer(spec["optim"], name=f"optim_{k:02d}")
            loss_scale = (LossScale(settings["trainer"]["initial_loss_scale"], name=f"loss_scale_{k:02d}")
                          if scaled else None)
            stage = Stage(k, device, model, optimizer, target, head, spec, loss_scale=loss_scale)
            optimizer.build(stage.trainable_variables)
        stages.append(stage)
        shape = out_shape
    return stages
