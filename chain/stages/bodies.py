"""Stage bodies: what computes a stage, built inside its device scope.

A *body* is a function `body(input_shape, dtype_policy, name) -> keras.Model` that
`chain.stages.assemble.build_stages` calls inside `tf.device(stage.device)`, so every
variable it creates lives on the stage's device. Three kinds:

- the chain's own (`mlp`, `conv`): `chain.stages.assemble.model_layers`;
- the user's code (`from_builder`): a callable named by Hydra's `_target_` in the config,
  or passed to `chain.build(cfg, stages=[...])`, called with `input_shape=` and its keyword
  arguments; it returns a `keras.Layer`, a `keras.Model` or a list of layers;
- a piece of one user model cut into stages (`chain.stages.cut`).

The chain's own last stage ends in a read-out in mode=e2e; a user's body that ends the
chain must produce the prediction itself (checked at build).
"""

from __future__ import annotations

import contextlib
from typing import Any, Callable, Iterator, Sequence

import keras

from chain import targets
from chain.errors import ConfigError, first_line, instantiate_error
from chain.stages import named_inputs

Body = Callable[[tuple, Any, str], keras.Model]


@contextlib.contextmanager
def dtype_policy(policy: keras.DTypePolicy | None) -> Iterator[None]:
    """Keras' global dtype policy set to `policy` for the block, then restored: layers that user
    code creates inside compute in the stage's precision, and nothing leaks to later models."""
    if policy is None:
        yield
        return
    before = keras.config.dtype_policy()
    keras.config.set_dtype_policy(policy)
    try:
        yield
    finally:
        keras.config.set_dtype_policy(before)


def layers_of(result: Any, what: str) -> list[keras.layers.Layer]:
    """The layers a builder returned (a layer, a model, or a list of layers), or a ConfigError."""
    items = list(result) if isinstance(result, (list, tuple)) else [result]
    if not items or not all(isinstance(x, keras.layers.Layer) for x in items):
        kinds = ", ".join(sorted({type(x).__name__ for x in items})) or "an empty list"
        raise ConfigError(
            f"{what} returned {kinds}; a builder returns a keras.Layer, a keras.Model or a list of layers"
        )
    return items


def assemble(layers: Sequence[keras.layers.Layer], input_shape: tuple, name: str, what: str) -> keras.Model:
    """The stage's model: `layers` in a Sequential on `input_shape`; a layer that cannot take its
    input is a ConfigError naming the builder. A model of named inputs (a keras_hub model's
    `{"token_ids", "padding_mask"}`) keeps its own inputs, which no one shape describes: the stage's
    model calls it on them (the config's token ids become those inputs: `chain.stages.named_inputs`)."""
    if len(layers) == 1 and isinstance(layers[0], keras.Model) and named_inputs.named(layers[0]) is not None:
        model = layers[0]
        return keras.Model(model.input, model(model.input), name=name)
    try:
        return keras.Sequential([keras.Input(input_shape), *layers], name=name)
    except Exception as e:  # Keras raises ValueError, TypeError, ... for a shape that does not fit
        raise ConfigError(f"{what} cannot take input of shape {tuple(input_shape)}: {first_line(e)}") from None


def from_builder(target: str | Callable, kwargs: dict | None, what: str) -> Body:
    """A body from user code: `target` is an import path (Hydra's `_target_`) or a callable.

    It is called as `target(input_shape=shape, **kwargs)` inside the stage's device scope,
    under the stage's dtype policy; `what` names it in errors (`stages[1].model._target_=...`).
    An import path is resolved and checked to be callable first (`chain.targets.function`), then
    called through Hydra's `instantiate`.
    """
    if isinstance(target, str):
        targets.function(what.partition("=")[0], target, targets.BUILDER_RETURNS)

    def body(input_shape: tuple, policy: Any, name: str) -> keras.Model:
        from hydra.utils import instantiate

        try:
            with dtype_policy(policy):
                if isinstance(target, str):
                    result = instantiate(
                        {"_target_": target, **(kwargs or {})}, input_shape=tuple(input_shape), _convert_="all"
                    )
                else:
                    result = target(input_shape=tuple(input_shape), **(kwargs or {}))
                return assemble(layers_of(result, what), input_shape, name, what)
        except ConfigError:
            raise
        except Exception as e:  # a user's builder may raise anything; Hydra wraps it
            raise instantiate_error(e, what) from None

    return body


def check_prediction(model: keras.Model, target, where: str) -> None:
    """mode=e2e: a user's last stage must output the prediction of `target` (logits, or one value)."""
    shape = tuple(model.output_shape[1:])
    want = (*target.shape, target.classes) if target.classes else (1,)  # a label per position: logits per position
    # A `None` size before the classes (a keras_hub causal LM's `(batch, None, vocab)`: any sequence length)
    # takes the data's length, as an input's `None` takes the data's size.
    fits = (
        len(shape) == len(want)
        and shape[-1:] == want[-1:]
        and all(got is None or got == size for got, size in zip(shape[:-1], want[:-1]))
    )
    if not fits and not (not target.classes and shape == ()):
        kind = f"{target.classes} logits" if target.classes else "one value"
        raise ConfigError(
            f"{where} outputs shape {shape}, but the last stage of a mode=e2e chain must output the "
            f"prediction of target {target.name!r}: {kind}, shape {want}"
        )
