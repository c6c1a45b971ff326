"""Shapes and sizes of the chain a config builds, computed from the config alone.

Every stage body the schema knows (`mlp`, `conv`) has a shape rule and a parameter count
that need no TensorFlow, so a stage that cannot take its input (a conv stage after a flat
one) or a chain far too large for memory is refused before anything starts. The counts
equal what the built Keras models hold (tests/test_config.py checks them).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from chain.config.schema import Adam, Conv, KerasOptimizer, Mlp, Model, Optim, Sgd
from chain.data.catalog import DataInfo, Target
from chain.errors import ConfigError

FLOAT_BYTES = 4  # weights, optimizer slots and activations are float32 (mixed precision keeps float32 weights)


@dataclass(frozen=True)
class StageShape:
    """One stage as the config describes it: what it takes, what it gives, its trainable parameters
    (body plus head or read-out), the floats of activation it keeps per example, and its largest
    layer's parameters."""

    input_shape: tuple[int, ...]
    output_shape: tuple[int, ...]
    params: int
    activations_per_example: int
    largest_layer: int


def body_shape(model: Model, input_shape: tuple[int, ...], where: str) -> tuple[int, ...]:
    """The output shape of a stage body on inputs of `input_shape` (per example)."""
    if isinstance(model, Conv):
        if len(input_shape) != 3:
            raise ConfigError(
                f"{where}.model=conv needs image input (height, width, channels), but receives shape {input_shape}; "
                "put conv stages first and use data=digits"
            )
        return (*input_shape[:2], model.filters)
    return (model.width,)


def layer_params(model: Model, input_shape: tuple[int, ...]) -> list[int]:
    """Trainable parameters of each layer of a stage body (kernel and bias)."""
    if isinstance(model, Conv):
        k2, f = model.kernel_size**2, model.filters
        return [k2 * input_shape[-1] * f + f] + [k2 * f * f + f] * (model.depth - 1)
    w = model.width
    return [math.prod(input_shape) * w + w] + [w * w + w] * (model.depth - 1)


def body_activations(model: Model, output_shape: tuple[int, ...]) -> int:
    """Floats of activation a body produces per example (one tensor per layer)."""
    return model.depth * math.prod(output_shape)


def readout_params(target: Target, input_shape: tuple[int, ...]) -> int:
    """A linear read-out of `target`: logits for classes, one unit for a value."""
    units = target.classes or 1
    return math.prod(input_shape) * units + units


def stage_shapes(stages, info: DataInfo, mode: str) -> list[StageShape | None]:
    """Each stage's shapes and sizes; mode=local adds a head per stage, mode=e2e a read-out on the
    last; mode=side_by_side's models each take the data and have a head.

    None for a stage whose body the config alone does not describe (a builder, a cut Keras
    model) and for every stage after it in a chain: their shapes are known once built.
    """
    out, shape = [], tuple(info.input_shape)
    chained = mode != "side_by_side"
    for k, spec in enumerate(stages):
        where = f"stages[{k}]"
        if not chained:
            shape = tuple(info.input_shape)
        if shape is None or not isinstance(spec.model, (Mlp, Conv)):
            out.append(None)
            shape = None
            continue
        output = body_shape(spec.model, shape, where)
        layers = layer_params(spec.model, shape)
        target = info.target(spec.target)
        if mode != "e2e" or k == len(stages) - 1:
            layers.append(readout_params(target, output))
        out.append(StageShape(shape, output, sum(layers), body_activations(spec.model, output), max(layers)))
        shape = output
    return out


def optimizer_slots(optim: Optim) -> int:
    """Floats of optimizer state per parameter (Adam, AdamW: two moments; SGD: momentum, if any;
    an optimizer by `_target_`: two, what most of Keras' keep at most)."""
    if isinstance(optim, (Adam, KerasOptimizer)):
        return 2
    return 1 if isinstance(optim, Sgd) and optim.momentum > 0 else 0


def human(n: float) -> str:
    """Bytes as a short text: 1.5 GB, 12 MB."""
    for unit in ("B", "KB", "MB", "GB", "TB", "PB"):
        if n < 1000 or unit == "PB":
            return f"{n:.3g} {unit}"
        n /= 1000
    return f"{n:.3g} PB"
