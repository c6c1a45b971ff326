"""Building stages: every stage's model, head and optimizer created on its device.

Layers are the unit of a stage's model (a stage is a group of layers), so a chain can
be cut differently later. Everything with state is created inside
`tf.device(stage.device)`, and the optimizer is built eagerly there: built lazily in the
first traced step, Keras 3 would put every slot variable on one device.
"""

from __future__ import annotations

from typing import Sequence

import keras
import tensorflow as tf

from chain import targets
from chain.config.schema import NO_DECAY_NORM, AdamW, Conv, KerasOptimizer, Model, Optim, Sgd, StageSpec
from chain.data.catalog import DataInfo, Target
from chain.errors import ConfigError, instantiate_error
from chain.internals.keras_private import all_layers
from chain.stages import lr_schedules, precision
from chain.stages.bodies import Body, check_prediction
from chain.stages.cut import Piece, passed, placed
from chain.stages.loss_scale import LossScale
from chain.stages.stage import Stage, stage_name


def model_layers(
    spec: Model, input_shape: tuple[int, ...], dtype: keras.DTypePolicy | str | None = None
) -> list[keras.layers.Layer]:
    """The layers of one stage's body, from its validated `model` section.

    `dtype` is every layer's dtype policy (`chain.stages.precision`); None: the global
    policy. The config checks (`chain.config.shapes`) already refused a body that cannot
    take `input_shape`.
    """
    layers: list[keras.layers.Layer] = []
    act = None if spec.activation == "linear" else spec.activation
    if isinstance(spec, Conv):
        if len(input_shape) != 3:  # after a user's stage the config checks could not know the shape
            raise ConfigError(
                f"model=conv needs image input (height, width, channels), but receives shape "
                f"{tuple(input_shape)}; put conv stages first"
            )
        for _ in range(spec.depth):
            layers.append(
                keras.layers.Conv2D(spec.filters, spec.kernel_size, padding="same", activation=act, dtype=dtype)
            )
            if spec.dropout:
                layers.append(keras.layers.Dropout(spec.dropout, dtype=dtype))
        return layers
    if len(input_shape) > 1:
        layers.append(keras.layers.Flatten(dtype=dtype))
    for _ in range(spec.depth):
        layers.append(keras.layers.Dense(spec.width, activation=act, dtype=dtype))
        if spec.dropout:
            layers.append(keras.layers.Dropout(spec.dropout, dtype=dtype))
    return layers


def per_position_body(target: Target, spec: Model) -> None:
    """mode=e2e: a target with a label per position needs logits per position from the last stage, which
    the config's own bodies (flat mlp, conv) and their read-out do not give: one line, not a shape error."""
    if target.shape:
        raise ConfigError(
            f"target {target.name!r} has a label per position {target.shape}: the last stage must "
            f"output logits per position, shape {(*target.shape, target.classes)}, which "
            f"model={'conv' if isinstance(spec, Conv) else 'mlp'} does not; use model=gpt (data=text, "
            "data=tokens) or give your model (model=keras, a builder, or chain.build(cfg, model=...))"
        )


def output_layers(target: Target, input_shape: tuple[int, ...]) -> list[keras.layers.Layer]:
    """A linear read-out of `target`: logits for classes, one unit for a value; always float32."""
    policy = precision.readout_policy()
    flat = [keras.layers.Flatten(dtype=policy)] if len(input_shape) > 1 else []
    return flat + [keras.layers.Dense(target.classes or 1, dtype=policy)]


def make_optimizer(spec: Optim, name: str | None = None, global_clip: bool = True) -> keras.optimizers.Optimizer:
    """A Keras optimizer from a validated `optim` section.

    `optim.clip_norm` is Keras' `clipnorm` (per variable, so the same on one stage as on one
    device). `optim.clip_global_norm` is Keras' `global_clipnorm` only with `global_clip`: an
    optimizer over a stage of a chain with one loss (mode=e2e) would clip by the stage's norm,
    not the chain's, so there the step clips (`chain.steps.clipping`) and the optimizer does not.
    `optim.fused` makes the update TensorFlow's fused kernel (`chain.stages.fused`); `optim.schedule`
    makes the learning rate a Keras schedule (`chain.stages.lr_schedules`); `optim._target_` names
    any Keras optimizer class (checked to be one before it is called), created through Hydra's
    `instantiate`. AdamW's exclusions from the decay are the stage's to set (`exclude_from_decay`),
    once its variables exist.
    """
    from chain.stages import fused

    clips = {"clipnorm": spec.clip_norm, "global_clipnorm": spec.clip_global_norm if global_clip else None}
    lr = lr_schedules.learning_rate(spec)
    if isinstance(spec, KerasOptimizer):
        return _instantiated(spec, lr, name, clips)
    if isinstance(spec, Sgd):
        sgd = fused.FusedSGD if spec.fused else keras.optimizers.SGD
        return sgd(learning_rate=lr, momentum=spec.momentum, name=name, **clips)
    if isinstance(spec, AdamW):
        adamw = fused.FusedAdamW if spec.fused else keras.optimizers.AdamW
        return adamw(
            learning_rate=lr, weight_decay=spec.weight_decay, beta_1=spec.beta_1, beta_2=spec.beta_2, name=name, **clips
        )
    adam = fused.FusedAdam if spec.fused else keras.optimizers.Adam
    return adam(learning_rate=lr, beta_1=spec.beta_1, beta_2=spec.beta_2, name=name, **clips)


def _instantiated(spec: KerasOptimizer, lr, name: str | None, clips: dict) -> keras.optimizers.Optimizer:
    """`optim._target_`'s optimizer: its class resolved and checked first (`chain.targets.optimizer_class`:
    nothing of a wrong kind is called), then made through Hydra's `instantiate` (its policy on targets
    too); one ConfigError line naming the key when it cannot be."""
    from hydra.utils import instantiate

    what = f"optim._target_={spec._target_}"
    targets.optimizer_class("optim._target_", spec._target_)
    try:
        return instantiate(
            {"_target_": spec._target_, **spec.kwargs},
            learning_rate=lr,
            name=name,
            **{k: v for k, v in clips.items() if v is not None},
        )
    except Exception as e:  # noqa: BLE001 - whatever the user's target raises is one line naming it
        raise instantiate_error(e, what) from None


def exclude_from_decay(optimizer: keras.optimizers.Optimizer, spec: Optim, stage: Stage) -> None:
    """Leave `optim.no_decay`'s variables of `stage` out of AdamW's weight decay (before the
    optimizer is built): `norm` names every variable of a normalization layer (a layer whose class
    name holds `Norm`, nested ones included), any other word a part of a variable's path (`bias`)."""
    if not isinstance(spec, AdamW):
        return
    variables = stage.trainable_variables
    words = [w for w in spec.no_decay if w != NO_DECAY_NORM]
    excluded = [v for v in variables if any(w in v.path for w in words)]
    if NO_DECAY_NORM in spec.no_decay:
        norms = {
            id(v)
            for m in (stage.model, stage.head)
            if m is not None
            for layer in all_layers(m)
            if layer is not m and "Norm" in type(layer).__name__
            for v in layer.trainable_variables
        }
        excluded += [v for v in variables if id(v) in norms]
    optimizer.exclude_from_weight_decay(var_list=excluded)


def build_stages(
    specs: Sequence[StageSpec],
    devices: Sequence[str | None],
    info: DataInfo,
    *,
    heads: bool,
    readout: bool,
    precision_name: str = "float32",
    initial_loss_scale: float = 2.0**15,
    bodies: Sequence[Body | None] | None = None,
    labels: Sequence[str | None] | None = None,
    chained: bool = True,
    seed: int | None = None,
) -> list[Stage]:
    """Create every stage's model, optimizer and (with `heads`) head inside its device scope.

    `heads`: every stage gets a linear head predicting its target (mode=local);
    `readout`: the chain is one network (mode=e2e) whose last stage predicts its target:
    the chain's own last body gets a read-out appended, a user's body must output the
    prediction itself. `bodies[k]` (`chain.stages.bodies`) builds stage k's model when the
    config's own `mlp`/`conv` does not (None: from `specs[k]`); `labels[k]` describes it.
    `chained=False` builds independent models (mode=side_by_side): each takes the data and,
    given `seed`, is built right after seeding every random generator with it, so its initial
    weights and dropout seeds come from the seed and its own spec, never from the models
    built before it: the same as a one-stage run of that model with this seed.
    Body layers compute in `precision_name` (read-outs in float32); under mixed_float16
    each stage also gets its `LossScale`, created on its device.
    """
    policy = precision.body_policy(precision_name)
    scaled = precision.needs_loss_scale(precision_name)
    bodies = placed(bodies or [None] * len(specs), devices)  # a cut model's tied weights: where each lives
    stages = []
    shape = info.model_input_shape
    for k, (spec, device) in enumerate(zip(specs, devices)):
        target = info.target(spec.target)
        label = labels[k] if labels else None
        if not chained:
            shape = info.model_input_shape
            if seed is not None:
                keras.utils.set_random_seed(seed)
        with tf.device(device):
            model = _model(k, spec, bodies[k], shape, policy, target, readout and k == len(specs) - 1, label)
            scale = initial_loss_scale if scaled else None
            stage = _stage(k, device, model, spec, target, bodies[k], label, heads, readout, scale)
        stages.append(stage)
        # Several tensors crossing to the next stage: each one's shape as this stage gives it (a keras_hub
        # backbone's own graph leaves the sequence length open; this stage, built on the data's shape, knows it).
        shape = passed(model) if isinstance(model.output_shape, list) else tuple(model.output_shape[1:])
    refuse_shared_variables(stages)
    return stages


def _model(
    k: int,
    spec: StageSpec,
    body: Body | None,
    shape: tuple[int, ...],
    policy: keras.DTypePolicy | str | None,
    target: Target,
    predicts: bool,
    label: str | None,
) -> keras.Model:
    """Stage k's model on inputs of `shape`: `body`'s, or the config's own mlp/conv (None); `predicts`: the
    chain's prediction comes out of it (the config's own body gets a read-out, a user's body is checked)."""
    if body is None:
        model = keras.Sequential([keras.Input(shape)] + model_layers(spec.model, shape, policy), name=stage_name(k))
        if predicts:
            per_position_body(target, spec.model)
            for layer in output_layers(target, tuple(model.output_shape[1:])):
                model.add(layer)
        return model
    model = body(shape, policy, stage_name(k))
    if predicts:
        check_prediction(model, target, f"stage {k} ({label or 'a user model'})")
    return model


def _stage(
    k: int,
    device: str | None,
    model: keras.Model,
    spec: StageSpec,
    target: Target,
    body: Body | None,
    label: str | None,
    heads: bool,
    readout: bool,
    initial_loss_scale: float | None,
) -> Stage:
    """Stage k around `model` (in its device's scope): its head (with `heads`), its optimizer, built, and its
    `LossScale` from `initial_loss_scale` (None: none)."""
    out_shape = tuple(model.output_shape[1:])
    head = None
    if heads:
        head = keras.Sequential([keras.Input(out_shape)] + output_layers(target, out_shape), name=f"head_{k:02d}")
    # mode=e2e (`readout`): one loss for the chain, whose step clips by the chain's global norm
    optimizer = make_optimizer(spec.optim, name=f"optim_{k:02d}", global_clip=not readout)
    loss_scale = None if initial_loss_scale is None else LossScale(initial_loss_scale, name=f"loss_scale_{k:02d}")
    piece = body if isinstance(body, Piece) else None  # a cut model's: its tied weights
    stage = Stage(
        k,
        device,
        model,
        optimizer,
        target,
        head,
        spec,
        loss_scale=loss_scale,
        label=label,
        shared=piece.shared if piece else (),
        whole=piece.whole if piece else None,
        borrowed=piece.borrowed if piece else (),
    )
    exclude_from_decay(optimizer, spec.optim, stage)
    optimizer.build(stage.trainable_variables)
    return stage


def refuse_shared_variables(stages: Sequence[Stage]) -> None:
    """A ConfigError if one variable belongs to two stages (a layer object a user's builders put in
    both): it lives on one device, and each stage's optimizer would update it, twice a step.
    (A cut model's tied weight is different: each stage holding it gets its own copy, `Stage.shared`.)"""
    owner: dict[int, int] = {}
    for s in stages:
        head = s.head.variables if s.head is not None else []
        for v in list(s.model.variables) + list(head):
            k = owner.setdefault(id(v), s.index)
            if k != s.index:
                raise ConfigError(
                    f"stage {s.index} ({s.describe()}) uses the variable {v.path!r} of stage {k}; a "
                    "weight shared by two stages is not supported yet (it would live on one stage's "
                    "device and both stages' optimizers would update it): give each stage its own layers"
                )
