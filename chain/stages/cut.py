"""One Keras model cut into stages: where it may be cut, how to cut it, and stage bodies that
compute exactly what its layers computed.

A model (Sequential or functional, one input, one output, no layer used twice) may be cut
before layer c only where one tensor crosses: layer c-1's output. A skip connection inside
a stage is fine; one that would cross a cut is refused, naming the layer and the cut.
Each stage's body re-creates its layers from their configs inside the stage's device scope,
replays their connections, and copies their weights, so the stages together compute the
original model's function exactly (the chain's predictions equal `model.predict` before
training).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Sequence

import keras

from chain.errors import ConfigError
from chain.planning import balance
from chain.stages.bodies import Body


@dataclass
class Cuttable:
    """A model's layers in order (input layer aside), what each takes, and the cuts it allows.

    `sources[i]` is the structure of layer i's first argument with tensors replaced by the
    index of the layer that makes them (-1: the model's input): `3` or `[2, 3]`.
    """

    model: keras.Model
    name: str
    layers: list[keras.layers.Layer]
    sources: list[Any]
    input_shape: tuple[int, ...]
    allowed: list[int]
    blocked: dict[int, str] = field(default_factory=dict)  # cut position -> why it is not allowed

    def params(self) -> list[int]:
        """Trainable parameters of each layer."""
        return [sum(math.prod(v.shape) for v in layer.trainable_variables) for layer in self.layers]


def _flat(src: Any) -> list[int]:
    return [j for x in src for j in _flat(x)] if isinstance(src, list) else [src]


def _history(arg: Any, index: dict[str, int], name: str, layer: str) -> Any:
    """An inbound-node argument of a model's config, tensors replaced by their producers' indices."""
    if isinstance(arg, list):
        return [_history(a, index, name, layer) for a in arg]
    if isinstance(arg, dict) and arg.get("class_name") == "__keras_tensor__":
        producer, node, tensor = arg["config"]["keras_history"]
        if producer not in index or node != 0 or tensor != 0:
            raise ConfigError(f"{name}: layer {layer!r} takes a tensor of {producer!r} that a chain cannot pass "
                              "(a second call of a layer, or a layer with several outputs)")
        return index[producer]
    raise ConfigError(f"{name}: layer {layer!r} takes an argument the chain cannot pass between stages ({arg!r})")


def analyse(model: keras.Model, name: str) -> Cuttable:
    """Check that `model` can be cut into a chain of stages and find where; `name` names it in errors.

    The connections come from the model's own config (what `model.save` writes), not from its
    layers' `input`/`output` attributes, which a loaded model does not keep consistent.
    """
    if len(model.inputs) != 1 or len(model.outputs) != 1:
        raise ConfigError(f"{name} has {len(model.inputs)} inputs and {len(model.outputs)} outputs; a model cut into "
                          "a chain of stages has one of each")
    layers = [layer for layer in model.layers if not isinstance(layer, keras.layers.InputLayer)]
    if not layers:
        raise ConfigError(f"{name} has no layers to cut")
    if isinstance(model, keras.Sequential):
        sources = [i - 1 for i in range(len(layers))]
    else:
        config = model.get_config()
        index = {e["name"]: -1 for e in config["layers"] if e["class_name"] == "InputLayer"}
        sources = []
        for i, layer in enumerate(layers):
            (entry,) = [e for e in config["layers"] if e["name"] == layer.name]
            nodes = entry.get("inbound_nodes") or []
            if len(nodes) != 1 or len(nodes[0]["args"]) != 1:
                raise ConfigError(f"{name}: layer {layer.name!r} is called {len(nodes)} times or with several "
                                  "arguments; a model cut into stages calls each layer once on one input")
            sources.append(_history(nodes[0]["args"][0], index, name, layer.name))
            index[layer.name] = i
        output = config["output_layers"]
        output = output[0] if output and isinstance(output[0], list) else output  # one output: [name, 0, 0]
        if output[0] != layers[-1].name:
            raise ConfigError(f"{name}: its output is not its last layer's ({layers[-1].name!r}); "
                              "a model cut into stages ends in its last layer")
    last_use: dict[int, tuple[int, str]] = {}  # producer -> (its last consumer, that consumer's name)
    for i, src in enumerate(sources):
        for p in _flat(src):
            last_use[p] = (i, layers[i].name)
    blocked: dict[int, str] = {}
    for p, (q, consumer) in sorted(last_use.items()):
        for c in range(p + 2, q + 1):  # cuts before layers p+2..q separate producer p from consumer q
            source = "the model's input" if p < 0 else f"the output of {layers[p].name!r} (layer {p})"
            blocked.setdefault(c, f"layer {consumer!r} (layer {q}) takes {source} across it")
    allowed = [c for c in range(1, len(layers)) if c not in blocked]
    return Cuttable(model, name, layers, sources, tuple(model.inputs[0].shape[1:]), allowed, blocked)


def check_sizes(c: Cuttable, sizes: Sequence[int], key: str) -> None:
    """A ConfigError unless `sizes` (layers per stage) cut `c` at allowed positions."""
    if sum(sizes) != len(c.layers):
        raise ConfigError(f"{key}={list(sizes)} adds up to {sum(sizes)} layers, but {c.name} has {len(c.layers)} "
                          f"({', '.join(layer.name for layer in c.layers)})")
    for k, at in enumerate(balance.sizes_to_cuts(sizes)):
        if at in c.blocked:
            raise ConfigError(f"{key}={list(sizes)} cuts {c.name} before layer {c.layers[at].name!r} (between stages "
                              f"{k} and {k + 1}), but {c.blocked[at]}; a model is cut where one tensor crosses")


def split(c: Cuttable, n_stages: int, sizes: Sequence[int] | None, how: str, costs: Sequence[Sequence[float]] | None
          ) -> list[int]:
    """Layers per stage: `sizes` as given (`placement.split`), or from `how` (`placement.balance`):
    `even` layer counts, near-equal `params`, or near-equal measured `time` (`costs[k][i]`:
    layer i's time on stage k's device)."""
    if n_stages > len(c.layers):
        raise ConfigError(f"{n_stages} stages, but {c.name} has only {len(c.layers)} layers; every stage needs one")
    if sizes is not None:
        check_sizes(c, sizes, "placement.split")
        return list(sizes)
    if how == "even":
        sizes = balance.even(len(c.layers), n_stages)
        if not set(balance.sizes_to_cuts(sizes)) & set(c.blocked):
            return sizes
        rows = [[1.0] * len(c.layers)] * n_stages  # the most even split a skip connection allows
    elif how == "params":
        rows = [[float(p) for p in c.params()]] * n_stages
    else:
        rows = [list(r) for r in costs]
    found = balance.partition(rows, n_stages, c.allowed)
    if found is None:
        raise ConfigError(f"{c.name} cannot be cut into {n_stages} stages where one tensor crosses: it allows cuts "
                          f"before layers {', '.join(c.layers[i].name for i in c.allowed) or 'none'}")
    return found


def _clone(layer: keras.layers.Layer, policy: Any) -> keras.layers.Layer:
    config = keras.layers.serialize(layer)
    if policy is not None:
        config["config"]["dtype"] = keras.dtype_policies.serialize(policy)
    return keras.layers.deserialize(config)


def piece(c: Cuttable, start: int, end: int, last_policy: Any = None) -> Body:
    """The body of the stage holding layers [start, end) of `c`.

    Called inside the stage's device scope: re-creates each layer from its config (in the
    stage's dtype policy; the model's last layer in `last_policy`, float32 by default, as the
    chain's read-outs are), replays the connections among them, copies their weights.
    """
    def body(input_shape: tuple, policy: Any, name: str) -> keras.Model:
        boundary = c.model.inputs[0] if start == 0 else c.layers[start - 1].output
        inp = keras.Input(tuple(boundary.shape[1:]))
        made = {start - 1: inp}  # producer index -> its tensor in the new model

        def arg(src: Any) -> Any:
            return [arg(x) for x in src] if isinstance(src, list) else made[src]  # valid cuts: src >= start - 1

        clones = []
        for i in range(start, end):
            layer = c.layers[i]
            clone = _clone(layer, last_policy if i == len(c.layers) - 1 else policy)
            made[i] = clone(arg(c.sources[i]))
            clones.append((clone, layer))
        model = keras.Model(inp, made[end - 1], name=name)
        for clone, layer in clones:
            clone.set_weights(layer.get_weights())
        return model

    return body


def pieces(c: Cuttable, sizes: Sequence[int]) -> list[Body]:
    """One body per stage for layers per stage `sizes`."""
    bounds = [0, *balance.sizes_to_cuts(sizes), len(c.layers)]
    return [piece(c, a, b, keras.DTypePolicy("float32")) for a, b in zip(bounds, bounds[1:])]


def describe(c: Cuttable, start: int, end: int) -> str:
    """`model.keras[3:6]`-style label of a stage's layers, for the placement table."""
    return f"{c.name} layers {start}-{end - 1} ({c.layers[start].name}..{c.layers[end - 1].name})"
