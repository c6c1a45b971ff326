"""One Keras model cut into stages: where it may be cut, how to cut it, and stage bodies that
compute exactly what its layers computed.

A model (Sequential or functional, one output; one input or several, a list or a dict) may be cut
before any layer: every tensor the layers from there on still need crosses the cut as one structure
(a Keras implicit mask with its tensor, `chain.stages.masks`; integer and boolean leaves without
gradients). Balancing prefers cuts that one tensor crosses (`allowed`) unless they make the largest
stage much costlier, and never leaves a stage without weights. What happens inside a stage is free:
skips, branches, a layer taking several tensors (`MultiHeadAttention()(x, x)`), ops that are not layers
(kept with the layer before them), a layer called again (keras_hub's `token_embedding(x, reverse=True)`).
Each stage's body re-creates its layers (`cls.from_config(layer.get_config())`, as
`keras.models.clone_model` does: no registry, no config file round trip) inside the stage's
device scope, replays the model's own calls among them (the graph's nodes, with their
arguments) from the tensor crossing into the stage to the one crossing out, and copies their
weights, so the stages together compute the original model's function exactly (the chain's
predictions equal `model.predict` before training).

A variable two layers hold (a tied weight: a custom layer holding the Embedding layer whose
matrix it reuses) is re-created on each stage that uses it, bound to the same attribute of the
re-created later layer; where it lives (the stage holding its first holder, the stages borrowing
that layer on its device, the copies elsewhere) is resolved once, before any stage is built
(`placed`, `chain.stages.tied_weights`), so each stage builds from that record alone, in any order.
A layer called several times (T5's embedding, by its encoder and its decoder; ALBERT's one block at
every depth) is listed once per call, and a call after the first is such a tie; so is a layer inside
an earlier one that the model calls itself (OPT's read-out, the token embedding inside its embedding
layer: `Cuttable.within`), whose copy on another device is the inner layer alone.
"""

from __future__ import annotations

import contextlib
import inspect
import math
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import keras

from chain.errors import ConfigError, first_line
from chain.internals.keras_private import (
    graph_nodes,
    keras_mask,
    move_variables,
    plain_functional,
    untrack_attribute,
    untrack_sublayer,
)
from chain.planning import balance
from chain.planning.devices import canonical
from chain.stages.bodies import Body
from chain.stages.masks import carried
from chain.stages.savable import Lent, MaskOf, WithMask
from chain.stages.named_inputs import named
from chain.stages.stage import SharedCopy
from chain.stages.tied_weights import Holders, first_holders


@dataclass
class Cuttable:
    """A model's layers in call order (input layer aside), each one's call in the model's graph,
    and the cuts it allows.

    `nodes[i]` is layer i's call (a Keras graph node: its arguments, its output tensors);
    `boundary[c]` the tensors crossing cut position c (0: the model's input, `len(layers)`:
    its output), for every position; `allowed` the positions one tensor crosses (with its mask,
    if it carries one), which the balancing prefers.
    """

    model: keras.Model
    name: str
    layers: list[keras.layers.Layer]
    nodes: list[Any]
    input_shape: tuple[int | None, ...]
    allowed: list[int]
    boundary: dict[int, Any]
    blocked: dict[int, str] = field(default_factory=dict)  # cut position -> why it is not allowed
    tied: dict[int, int] = field(default_factory=dict)  # id(variable two layers hold) -> its first holder's index
    ops: dict[int, list[Any]] = field(default_factory=dict)  # layer index (-1: none yet) -> op nodes run after it
    # (cut position, id(crossing tensor)) for those carrying an implicit Keras mask across it when Keras runs the model
    masked: frozenset[tuple[int, int]] = frozenset()
    refused: dict[int, str] = field(default_factory=dict)  # cut position -> why no stage may start there
    alias: dict[int, Any] = field(default_factory=dict)  # id(a nested model's input or output) -> what it stands for
    # layer index -> (an earlier layer holding it as a sublayer, the attributes leading to it): OPT's read-out
    # calls the token embedding inside its embedding layer, a tie through a nested layer
    within: dict[int, tuple[int, tuple[str, ...]]] = field(default_factory=dict)

    def params(self) -> list[int]:
        """Trainable parameters of each layer."""
        return [sum(math.prod(v.shape) for v in layer.trainable_variables) for layer in self.layers]

    def weights(self) -> list[int]:
        """Variables of each layer (trainable or not): a stage must hold some."""
        return [len(layer.weights) for layer in self.layers]

    def outputs(self) -> list[int]:
        """Floats per example of each layer's outputs (what a tape keeps of it), from the model's graph:
        an unknown dimension (None, a sequence of any length) counts 1."""
        return [sum(math.prod(d or 1 for d in t.shape[1:]) for t in node.outputs) for node in self.nodes]

    def crossing(self, position: int) -> int:
        """Values per example of the tensors crossing cut `position` (0: the model's input), masks included."""
        return sum(
            math.prod(d or 1 for d in t.shape[1:]) * (1 + ((position, id(t)) in self.masked))
            for t in self.boundary[position]
        )

    def structure(self) -> list[Any]:
        """What the model computes, as plain values (its weights' values aside): each layer's class, its
        configuration (its name aside), its outputs' and weights' shapes; the ops between layers; the shapes
        crossing each cut. Two models alike in these take the same time."""
        layers = []
        for layer, node in zip(self.layers, self.nodes):
            try:
                config = {k: v for k, v in layer.get_config().items() if k != "name"}
            except Exception:  # a user's layer may raise anything here: its class and shapes stand for it
                config = None
            layers.append(
                [
                    f"{type(layer).__module__}.{type(layer).__qualname__}",
                    config,
                    [list(t.shape) for t in node.outputs],
                    [list(v.shape) for v in layer.weights],
                ]
            )
        ops = {str(k): [type(n.operation).__name__ for n in nodes] for k, nodes in sorted(self.ops.items())}
        cuts = [[list(t.shape) for t in self.boundary[c]] for c in sorted(self.boundary)]
        return [layers, ops, cuts]

    def points(self, several: bool = False) -> list[int]:
        """0, every cut one tensor crosses (`allowed`), and the layer count: the links `balance=time` times.
        `several` (mode=e2e's, which sends every tensor crossing a cut: plan=auto's links): also each cut where
        one tensor crosses besides the model's own inputs and tensors without a gradient (ids, masks: keras_hub's
        `padding_mask`, which every block reads). Not every cut e2e allows: two activations crossing (inside a
        residual block) would make each layer of a deep network a link, timed alone."""
        if not several:
            return [0, *self.allowed, len(self.layers)]
        inputs = {id(t) for t in self.boundary[0]}

        def activations(c: int) -> int:  # tensors crossing cut c that are not the model's inputs, ids or masks
            return sum(id(t) not in inputs and keras.backend.is_float_dtype(t.dtype) for t in self.boundary[c])

        cuts = [c for c in range(1, len(self.layers)) if c not in self.refused and activations(c) <= 1]
        return [0, *sorted({*self.allowed, *cuts}), len(self.layers)]


def _graph(model: keras.Model, name: str) -> keras.Model:
    """The functional graph of `model`: a Sequential's own layers' calls, a functional model itself."""
    try:
        inputs, outputs = model.inputs, model.outputs
    except (AttributeError, ValueError):
        inputs = outputs = None
    if not isinstance(inputs, list) or not isinstance(outputs, list):
        raise ConfigError(
            f"{name} is a {type(model).__name__} whose connections are Python code (a subclassed model, "
            "or a Sequential without keras.Input): a model cut into stages is Sequential or functional, "
            "built on keras.Input"
        )
    if len(outputs) != 1:
        raise ConfigError(
            f"{name} has {len(outputs)} outputs; a model cut into a chain of stages has one "
            "(the prediction its loss reads)"
        )
    return keras.Model(inputs, outputs) if isinstance(model, keras.Sequential) else model


def _calls(graph: keras.Model) -> dict[int, list[Any]]:
    """id(layer) -> its calls (graph nodes) in `graph`."""
    calls: dict[int, list[Any]] = {}
    for node in graph_nodes(graph):  # Keras keeps no public view of a model's nodes
        if not node.is_input:
            calls.setdefault(id(node.operation), []).append(node)
    return calls


def _path(outer: keras.layers.Layer, inner: keras.layers.Layer, depth: int = 3) -> tuple[str, ...] | None:
    """The attributes leading from `outer` to its sublayer `inner` (`("token_embedding",)`), or None."""
    for attr, value in vars(outer).items():
        if value is inner:
            return (attr,)
        if isinstance(value, keras.layers.Layer) and depth > 1:
            found = _path(value, inner, depth - 1)
            if found is not None:
                return (attr, *found)
    return None


def _within(layers: Sequence[keras.layers.Layer], tied: dict[int, int]) -> dict[int, tuple[int, tuple[str, ...]]]:
    """Layer index -> (the earlier layer holding it as a sublayer, the attributes leading there), for each
    layer whose every weight an earlier layer holds through a sublayer (OPT's `embeddings.token_embedding`,
    called again as the read-out)."""
    out = {}
    for i, layer in enumerate(layers):
        owners = {tied.get(id(v)) for v in layer.weights}
        if len(owners) == 1 and None not in owners and layers[owner := owners.pop()] is not layer:
            path = _path(layers[owner], layer)
            if path is not None:
                out[i] = (owner, path)
    return out


def _op_name(node: Any) -> str:
    return getattr(node.operation, "name", type(node.operation).__name__)


def resolve(alias: dict[int, Any], t: Any) -> Any:
    """The tensor `t` stands for: a nested model's input is the tensor its caller gave it, the caller's
    output the nested model's own output."""
    while id(t) in alias:
        t = alias[id(t)]
    return t


class Made(dict):
    """id(the model's tensor) -> its tensor in a stage's model, looked up through `Cuttable.alias`
    (what Keras' `SymbolicArguments.fill_in` reads)."""

    def __init__(self, alias: dict[int, Any], *args: Any) -> None:
        super().__init__(*args)
        self.alias = alias

    def _key(self, k: int) -> int:
        while k in self.alias:
            k = id(self.alias[k])
        return k

    def __getitem__(self, k: int) -> Any:
        return super().__getitem__(self._key(k))

    def get(self, k: int, default: Any = None) -> Any:
        return super().get(self._key(k), default)

    def __contains__(self, k: object) -> bool:
        return super().__contains__(self._key(k))  # type: ignore[arg-type]

    def __setitem__(self, k: int, v: Any) -> None:
        super().__setitem__(self._key(k), v)

    def update(self, other: Any = (), **kw: Any) -> None:  # type: ignore[override]
        for k, v in dict(other, **kw).items():
            self[k] = v


def _call_order(graph: keras.Model, model: keras.Model, name: str) -> list[tuple[keras.layers.Layer, Any]]:
    """Every call of `model`'s layers in `graph` (a layer called several times once per call), in
    `model.layers`' order as far as the calls' inputs allow: a later call runs as soon as its inputs
    exist, before the layers after it in `model.layers` (ALBERT's one block called at every depth
    runs its calls in a row; T5's decoder embeds its ids right after the encoder does)."""
    calls = _calls(graph)
    rank = {id(layer): r for r, layer in enumerate(model.layers)}
    waiting = []
    for layer in model.layers:
        if isinstance(layer, keras.layers.InputLayer):
            continue
        found = calls.get(id(layer), [])
        if not found:
            raise ConfigError(
                f"{name}: layer {layer.name!r} is never called in the model's graph; a model cut into "
                "stages calls every layer it holds"
            )
        waiting += [(rank[id(layer)], k, layer, node) for k, node in enumerate(found)]
    ops = [n for n in graph_nodes(graph) if not n.is_input and id(n.operation) not in rank]
    made = {id(t) for t in graph.inputs}
    order: list[tuple[keras.layers.Layer, Any]] = []
    while waiting:
        ready = True
        while ready:  # the ops whose inputs exist (they need no order of their own)
            ready = [n for n in ops if all(id(t) in made for t in n.input_tensors)]
            ops = [n for n in ops if n not in ready]
            made.update(id(t) for n in ready for t in n.outputs)
        call = next((w for w in waiting if all(id(t) in made for t in w[3].input_tensors)), waiting[0])
        waiting.remove(call)  # (a call whose inputs never exist comes in its turn: analyse names it)
        order.append(call[2:])
        made.update(id(t) for t in call[3].outputs)
    return order


def _flatten(
    graph: keras.Model, model: keras.Model, name: str, alias: dict[int, Any]
) -> tuple[list[keras.layers.Layer], list[Any], list[Any]]:
    """`model`'s layers in call order with their calls in `graph` (a layer called n times is listed
    n times), and the graph's op nodes; a plain functional model among its layers is replaced by its
    own layers (recursively), its inputs and outputs recorded in `alias` as the tensors they stand for."""
    mine = {id(layer) for layer in model.layers}
    ops = [n for n in graph_nodes(graph) if not n.is_input and id(n.operation) not in mine]
    layers: list[keras.layers.Layer] = []
    nodes: list[Any] = []
    order = _call_order(graph, model, name)
    for layer, node in order:
        if (
            isinstance(layer, keras.Model)
            and plain_functional(layer)
            and len(layer.inputs) == len(node.input_tensors)
            and len(layer.outputs) == len(node.outputs)
        ):
            times = sum(x is layer for x, _ in order)
            if times > 1:
                raise ConfigError(
                    f"{name}: the model {layer.name!r} inside it is called {times} times; a model cut "
                    "into stages may call a layer several times, but a model inside it once (call its "
                    "layers instead)"
                )
            for inner, outer in zip(layer.inputs, node.input_tensors):
                if inner is not outer:  # a keras_hub task calls its backbone on the backbone's own inputs
                    alias[id(inner)] = outer
            for outer, inner in zip(node.outputs, layer.outputs):
                if inner is not outer:
                    alias[id(outer)] = inner
            more = _flatten(layer, layer, name, alias)
            layers, nodes, ops = layers + more[0], nodes + more[1], ops + more[2]
            continue
        layers.append(layer)
        nodes.append(node)
    return layers, nodes, ops


def analyse(model: keras.Model, name: str) -> Cuttable:
    """Check that `model` can be cut into a chain of stages and find where; `name` names it in errors.

    The connections come from the model's graph (each layer's call: which tensors it takes,
    which it makes), not from the layers' `input`/`output` attributes, which a loaded
    Sequential does not keep consistent. A functional model inside the model (a keras_hub
    backbone inside its task model) is cut through: its layers are the model's. A node of the graph that is not one of the model's
    layers (an op: `x[:, -1]`, `x * c`, the `not_equal` of a mask) has no weights: it stays on the
    stage of the latest layer whose output it takes (stage 0 when it takes only the model's input).
    """
    graph = _graph(model, name)
    alias: dict[int, Any] = {}
    layers, nodes, pending = _flatten(graph, model, name, alias)
    if not layers:
        raise ConfigError(f"{name} has no layers to cut")

    def key(t: Any) -> int:
        return id(resolve(alias, t))

    made, tensors, last_use, ops = _walk(graph, layers, nodes, pending, key, alias, name)
    out = graph.outputs[0]
    crossing, blocked, source = _crossings(layers, nodes, made, last_use)
    allowed = [c for c in range(1, len(layers)) if c not in blocked]
    boundary = {
        0: list(graph.inputs),
        len(layers): [out],
        **{c: [tensors[t] for t in ts] for c, ts in crossing.items()},
    }
    masked, refused = frozenset(), {}

    def recorded(t: int) -> bool:
        return keras_mask(tensors[t]) is not None

    if any(recorded(t) for ts in crossing.values() for t in ts):  # the graph's record: which ones Keras carries
        where = {id(n): i for i, n in enumerate(nodes)} | {id(n): p for p, ns in ops.items() for n in ns}
        masked, refused = carried(graph, crossing, where, key, source, recorded, name)
        allowed = [c for c in allowed if c not in refused]
    shape, tied = tuple(model.inputs[0].shape[1:]), first_holders(layers)
    return Cuttable(
        model,
        name,
        layers,
        nodes,
        shape,
        allowed,
        boundary,
        {**refused, **blocked},
        tied,
        ops=ops,
        masked=masked,
        refused=refused,
        alias=alias,
        within=_within(layers, tied),
    )


def _walk(
    graph: keras.Model,
    layers: list[Any],
    nodes: list[Any],
    pending: list[Any],
    key: Callable[[Any], int],
    alias: dict[int, Any],
    name: str,
) -> tuple[dict[int, tuple[int, int]], dict[int, Any], dict[int, tuple[int, str]], dict[int, list[Any]]]:
    """The model's calls in order, checked: each tensor's (producer, output k) and the tensor (by `key`),
    its (last consumer, that consumer's name) and the op nodes (`pending`, emptied) that run after each
    layer (-1: before the first), an op after the latest layer that made one of its inputs."""
    made: dict[int, tuple[int, int]] = {key(t): (-1, k) for k, t in enumerate(graph.inputs)}
    tensors = {key(t): t for t in graph.inputs}
    last_use: dict[int, tuple[int, str]] = {}
    ops: dict[int, list[Any]] = {}

    def use(t: Any, q: int, consumer: str) -> None:
        if last_use.get(key(t), (-2,))[0] <= q:
            last_use[key(t)] = (q, consumer)

    def settle() -> None:  # every op whose inputs exist runs after the latest layer that made one
        ready = True
        while ready:
            ready = [n for n in pending if all(key(t) in made for t in n.input_tensors)]
            for n in ready:
                p = max((made[key(t)][0] for t in n.input_tensors), default=-1)
                ops.setdefault(p, []).append(n)
                pending.remove(n)
                for t in n.input_tensors:
                    use(t, p, _op_name(n))
                for k, t in enumerate(n.outputs):
                    made[key(t)], tensors[key(t)] = (p, k), resolve(alias, t)

    for i, (layer, node) in enumerate(zip(layers, nodes)):
        settle()
        for t in node.input_tensors:
            if key(t) not in made:
                raise ConfigError(
                    f"{name}: layer {layer.name!r} takes a tensor that no earlier layer of the model "
                    "makes; a model cut into stages lists its layers in call order"
                )
            use(t, i, layer.name)
        for k, t in enumerate(node.outputs):
            made[key(t)], tensors[key(t)] = (i, k), resolve(alias, t)
    settle()
    if pending:
        raise ConfigError(f"{name}: {_op_name(pending[0])!r} takes a tensor that no layer of the model makes")
    out = graph.outputs[0]
    if made.get(key(out), (None,))[0] != len(layers) - 1:
        raise ConfigError(
            f"{name}: its output is not its last layer's ({layers[-1].name!r}); "
            "a model cut into stages ends in its last layer"
        )
    use(out, len(layers), "the model's output")
    return made, tensors, last_use, ops


def _crossings(
    layers: list[Any], nodes: list[Any], made: dict[int, tuple[int, int]], last_use: dict[int, tuple[int, str]]
) -> tuple[dict[int, list[int]], dict[int, str], Callable[[int], str]]:
    """The tensors (ids) crossing each cut (before layer c, 1 <= c < len(layers)), given each tensor's
    (producer, output k) and (last consumer, its name); the cuts blocked and why (a tensor skips over it, or
    several cross it); and `source`, a tensor's producer in words."""
    crossing: dict[int, list[int]] = {c: [] for c in range(1, len(layers))}
    blocked: dict[int, str] = {}

    def source(t: int) -> str:
        p, k = made[t]
        if p < 0:
            return "the model's input"
        return (
            f"output {k} of {layers[p].name!r} (layer {p})"
            if len(nodes[p].outputs) > 1
            else f"the output of {layers[p].name!r} (layer {p})"
        )

    for t, (q, consumer) in sorted(last_use.items(), key=lambda kv: made[kv[0]]):
        p = made[t][0]
        for c in range(max(p + 1, 1), min(q, len(layers) - 1) + 1):  # t crosses the cuts before layers p+1..q
            crossing[c].append(t)
        for c in range(p + 2, q + 1):  # cuts before layers p+2..q separate producer p from consumer q
            blocked.setdefault(c, f"layer {consumer!r} (layer {q}) takes {source(t)} across it")
    for c, ts in crossing.items():
        if len(ts) > 1:
            blocked.setdefault(c, f"layer {layers[c - 1].name!r} (layer {c - 1}) passes {len(ts)} tensors across it")
    return crossing, blocked, source


def fits(shape: Sequence[int | None], data: Sequence[int]) -> bool:
    """Whether a model taking `shape` (None: any size) takes examples of shape `data`."""
    return len(shape) == len(data) and all(s is None or s == d for s, d in zip(shape, data))


ONE_TENSOR_SLACK = 1.5  # how much costlier a largest stage may be to cut only where one tensor crosses


def check_sizes(c: Cuttable, sizes: Sequence[int], key: str) -> None:
    """A ConfigError unless `sizes` (layers per stage) add up to `c`'s layers. Any cut is legal:
    where several tensors cross (a skip, a mask), they all cross."""
    if sum(sizes) != len(c.layers):
        raise ConfigError(
            f"{key}={list(sizes)} adds up to {sum(sizes)} layers, but {c.name} has {len(c.layers)} "
            f"({', '.join(layer.name for layer in c.layers)})"
        )
    for at in balance.sizes_to_cuts(sizes):
        if at in c.refused:
            raise ConfigError(
                f"{key}={list(sizes)} cuts {c.name} before layer {c.layers[at].name!r} (layer {at}), "
                f"where {c.refused[at]}: cut elsewhere"
            )


def split(
    c: Cuttable,
    n_stages: int,
    sizes: Sequence[int] | None,
    how: str,
    costs: Sequence[Sequence[float]] | None,
    one_tensor: str | None = None,
) -> list[int]:
    """Layers per stage: `sizes` as given (`placement.split`), or from `how` (`placement.balance`):
    `even` layer counts, near-equal `params`, near-equal measured `time` (`costs[k][i]`:
    layer i's time on stage k's device; a link (between two allowed cuts) may carry its whole
    time on one of its layers), or the smallest largest estimated peak, `memory` (`costs[k][i]`:
    the bytes layer i adds to stage k's peak, `chain.planning.footprint.layer_costs`).
    `one_tensor`: the `mode=...` whose stages each pass on one tensor (mode=local: a head reads it),
    which takes only cuts one tensor crosses and refuses a given split that cuts elsewhere (None: any cut)."""
    if n_stages > len(c.layers):
        raise ConfigError(f"{n_stages} stages, but {c.name} has only {len(c.layers)} layers; every stage needs one")
    if sizes is not None:
        check_sizes(c, sizes, "placement.split")
        if one_tensor is not None:
            _refuse_several(c, sizes, one_tensor)
        return list(sizes)
    weights = c.weights()
    if how == "even":
        sizes = balance.even(len(c.layers), n_stages)
        if not set(balance.sizes_to_cuts(sizes)) & set(c.blocked) and balance.weighted(sizes, weights):
            return sizes
        rows = [[1.0] * len(c.layers)] * n_stages  # the most even split the model's cuts allow
    elif how == "params":
        rows = [[float(p) for p in c.params()]] * n_stages
    else:
        rows = [list(r) for r in costs]
    # Cuts one tensor crosses first (the least to send) unless they balance much worse than any cut (an
    # explicit mask every block reads crosses every cut between blocks); never a stage without weights,
    # which would hold a device only to pass tensors on.
    one = balance.partition(rows, n_stages, c.allowed, weights=weights)
    if one_tensor is not None:
        if one is None:
            raise ConfigError(
                f"{one_tensor}: {c.name} cannot be cut into {n_stages} stages that each hold weights "
                "where one tensor crosses each cut (cuts one tensor crosses: "
                f"{_one_tensor_cuts(c)}), and each stage's head in {one_tensor} reads one tensor, its "
                "stage's output: use fewer stages, or mode=e2e"
            )
        return one
    found = balance.partition(
        rows, n_stages, [p for p in range(1, len(c.layers)) if p not in c.refused], weights=weights
    )
    if one is not None and (
        found is None or max(balance.stage_costs(rows, one)) <= ONE_TENSOR_SLACK * max(balance.stage_costs(rows, found))
    ):
        found = one
    if found is None:
        holding = sum(1 for w in weights if w)
        raise ConfigError(
            f"{c.name} cannot be cut into {n_stages} stages that each hold weights: {holding} of its "
            f"{len(c.layers)} layers have weights; use fewer stages, or placement.split to place a "
            "layer without weights on a stage of its own"
        )
    return found


def _one_tensor_cuts(c: Cuttable) -> str:
    """The cuts one tensor crosses, in words: `before layers 1 ('b'), 3 ('out')`."""
    if not c.allowed:
        return "none"
    return "before layers " + ", ".join(f"{i} ({c.layers[i].name!r})" for i in c.allowed)


def _refuse_several(c: Cuttable, sizes: Sequence[int], mode: str) -> None:
    """A ConfigError naming the first cut of `sizes` that several tensors cross: `mode`'s stages each pass
    on one tensor (mode=local's head reads a stage's output; of several, none is the stage's alone)."""
    at = next((k for k in balance.sizes_to_cuts(sizes) if k not in c.allowed), None)
    if at is None:
        return
    raise ConfigError(
        f"{mode}: placement.split={list(sizes)} cuts {c.name} before layer {at} "
        f"({c.layers[at].name!r}), where {c.blocked[at]}, but each stage's head in {mode} reads one "
        f"tensor, its stage's output: set mode=e2e, or a placement.split whose cuts one tensor "
        f"crosses: {_one_tensor_cuts(c)}"
    )


def _clone(c: Cuttable, layer: keras.layers.Layer, policy: Any) -> keras.layers.Layer:
    """`layer` re-created from its config (in `policy`, when given), without Keras' registry: an
    unregistered custom class and a Lambda are re-created as `keras.models.clone_model` does.
    Its Python code is already in this process (the model is), so nothing new runs."""
    try:
        config = layer.get_config()
        if policy is not None and "dtype" in config:
            config["dtype"] = keras.dtype_policies.serialize(policy)
        from_config = type(layer).from_config
        unsafe = {"safe_mode": False} if "safe_mode" in inspect.signature(from_config).parameters else {}
        return from_config(config, **unsafe)
    except Exception as e:  # a user's layer may raise anything here
        if policy is None or keras.dtype_policies.serialize(policy) == keras.dtype_policies.serialize(
            layer.dtype_policy
        ):
            # A layer whose config does not re-create it (keras_hub 0.32's LlamaTransformerDecoder) but that
            # trains: the layer object itself, its variables re-created on the stage's device (the user's
            # model then shares them with the chain).
            move_variables(layer)
            return layer
        raise ConfigError(
            f"{c.name}: layer {layer.name!r} ({type(layer).__name__}) cannot be re-created on its stage's "
            f"device from its config: {first_line(e)} (a custom layer's "
            "get_config() must return its constructor's arguments)"
        ) from None


def _holder_copy(c: Cuttable, owner: int, policy: Any) -> keras.layers.Layer:
    """A copy of layer `owner` made on the current stage's device, built and with its weights: what a
    stage without that layer holds in its place for a later layer that uses its weights."""
    layer = c.layers[owner]
    scope = layer.path.rpartition("/")[0]  # a layer inside another (OPT's token embedding): its variables' paths
    with keras.name_scope(scope) if scope else contextlib.nullcontext():  # the model's, as the stage's own are
        copy = _clone(c, layer, policy)
        copy.build_from_config(layer.get_build_config())
    copy.set_weights(layer.get_weights())
    return copy


def _retie(c: Cuttable, layer: keras.layers.Layer, clone: keras.layers.Layer, b: _Build) -> None:
    """Bind `clone`'s attributes that hold an earlier layer (or that layer's variable) in `layer` to
    the stage's copy of it, `b.holder(index)`."""
    index: dict[int, int] = {}
    for i, x in enumerate(c.layers):
        index.setdefault(id(x), i)  # a layer called several times: its first call
    for attr, value in list(vars(layer).items()):
        if isinstance(value, keras.layers.Layer) and c.tied and index.get(id(value), -1) in c.tied.values():
            made = getattr(clone, attr, None)  # a layer whose config holds the layer made its own from it:
            if isinstance(made, keras.layers.Layer):  # untracked, so its weights are not the clone's
                untrack_sublayer(clone, made)
            bound = b.holder(index[id(value)])
            setattr(clone, attr, bound)
            if b.is_lent(index[id(value)]):  # another stage's layer: its weights stay that stage's (its
                untrack_sublayer(clone, bound)  # optimizer's, its checkpoint's)
                untrack_attribute(clone, attr)
        elif (
            isinstance(value, keras.Variable)
            and c.layers[c.tied.get(id(value), 0)] is not layer
            and id(value) in c.tied
        ):  # a variable of an earlier layer (not the layer's own)
            owner = c.tied[id(value)]
            copy = b.holder(owner, lend=False)  # a variable attribute is tracked as the clone's own: never lent
            setattr(clone, attr, copy.weights[[id(w) for w in c.layers[owner].weights].index(id(value))])


def _check_retied(c: Cuttable, layer: keras.layers.Layer, clone: keras.layers.Layer, b: _Build) -> None:
    """A ConfigError unless each variable `layer` shares with an earlier layer is, in `clone`, the
    stage's copy of that variable."""
    mine = [id(w) for w in clone.weights]
    held = [v for v in layer.weights if not b.is_lent(c.tied.get(id(v), -1))]  # what the clone holds itself
    for i, v in enumerate(held):
        owner = c.tied.get(id(v))
        if owner is None or c.layers[owner] is layer:
            continue
        copy = b.holder(owner)
        want = copy.weights[[id(w) for w in c.layers[owner].weights].index(id(v))]
        if len(mine) != len(held) or mine[i] != id(want):
            raise ConfigError(
                f"{c.name}: layers {c.layers[owner].name!r} and {layer.name!r} share the variable "
                f"{v.path!r} (a tied weight), but {layer.name!r} is not a layer inside "
                f"{c.layers[owner].name!r} nor holds it (or its variable) as an attribute, so the cut "
                "cannot re-create the tie on a stage: in your layer, hold the layer itself as an "
                "attribute (self.embedding = embedding)"
            )


def _kept_dtype(t: Any) -> str | None:
    """The dtype of a stage's input standing for `t`: an integer or boolean tensor keeps its own; a float
    one takes Keras' default (float32), as a stage's input always has, and its layers cast it."""
    return None if "float" in str(t.dtype) else str(t.dtype)


def _record(made: dict[int, Any], node: Any, result: Any) -> None:
    """Add what a replayed call of `node` returned to `made`, by the model's tensors it stands for."""
    made.update({id(t): y for t, y in zip(node.outputs, keras.tree.flatten(result))})


def _run_ops(c: Cuttable, after: int, made: dict[int, Any]) -> None:
    """Replay the graph's op nodes that run after layer `after` (no weights: the op itself is
    called again on the stage's tensors), adding their outputs to `made`."""
    for node in c.ops.get(after, []):
        args, kwargs = node.arguments.fill_in(made)
        _record(made, node, node.operation(*args, **kwargs))


class _Build:
    """One call of a `Piece`: the stage's layers as they are made, and the model's tensors made so far.

    `clones`: (layer index, its clone or copy, the layer) whose weights the model's set; `copies`: layer
    index -> this stage's layer for it (its own clone, or a copy of an earlier stage's); `lent`: layer
    index -> the layer this stage borrows from an earlier stage on its device (`Holders`)."""

    def __init__(self, piece: Piece, policy: Any, given: dict[int, Any]) -> None:
        self.piece, self.c, self.policy = piece, piece.c, policy
        self.made = Made(piece.c.alias)  # id(the model's tensor) -> its tensor in the new model
        self.made.update(given)
        self.clones: list[tuple[int, keras.layers.Layer, keras.layers.Layer]] = []
        self.copies: dict[int, keras.layers.Layer] = {}
        self.lent: dict[int, keras.layers.Layer] = {}
        self.again_lent: list[keras.layers.Layer] = []  # layers called again here through a lent layer
        self.lends: dict[int, Lent] = {}  # id(a lent layer) -> the one Lent calling it here
        self.first_call: dict[int, int] = {}  # id(layer) -> the index of its first call (it may be called again)
        for j, x in enumerate(self.c.layers):
            self.first_call.setdefault(id(x), j)

    def holder(self, owner: int, lend: bool = True) -> keras.layers.Layer:
        """This stage's layer for layer `owner` (a tied weight's first holder): its own clone, the home's
        layer it borrows (`lend`), or a copy made here."""
        if owner in self.copies or owner in self.lent:
            return self.copies.get(owner) or self.lent[owner]
        if lend and self.piece.borrows(owner):  # one variable on one device
            self.lent[owner] = self.piece.lent_layer(owner, self.policy)
            return self.lent[owner]
        self.copies[owner] = _holder_copy(self.c, owner, self.policy)  # a holder on another device's stage
        return self.copies[owner]

    def is_lent(self, owner: int) -> bool:
        return owner in self.lent

    def add(self, i: int) -> None:
        """Layer i's call made again on this stage: its clone made (re-tied to this stage's holders), or, for a
        layer called again, the layer it calls."""
        c, layer, node = self.c, self.c.layers[i], self.c.nodes[i]
        if self.first_call[id(layer)] != i or i in c.within:  # a layer called again (keras_hub's
            self._again(i)  # `token_embedding(x, reverse=True)`; OPT's inside its embedding layer)
            return
        if self.piece.holders is not None and self.piece.holders.lent(i):  # the one object its borrowers read
            clone = self.piece.lent_layer(i, self.policy)
        else:
            clone = _clone(c, layer, self.piece.last_policy if i == len(c.layers) - 1 else self.policy)
        self.copies[i] = clone
        _retie(c, layer, clone, self)
        args, kwargs = node.arguments.fill_in(self.made)  # the call's own arguments, tensors replaced
        _record(self.made, node, clone(*args, **kwargs))
        _check_retied(c, layer, clone, self)
        self.clones.append((i, clone, layer))

    def _again(self, i: int) -> None:
        c, layer, node = self.c, self.c.layers[i], self.c.nodes[i]
        target, owner = self._called(i)
        if self.is_lent(owner):  # another stage's layer: called, not held (one Lent per layer lent)
            call = self.lends.setdefault(id(target), Lent(target))
        else:
            call = target
        args, kwargs = node.arguments.fill_in(self.made)
        _record(self.made, node, call(*args, **kwargs))
        if self.is_lent(owner):  # one variable on one device: borrowed, not copied (`Piece._held`)
            self.again_lent.append(layer)
        elif target is self.copies.get(owner) and all(target is not x for _, x, _ in self.clones):
            self.clones.append((owner, target, c.layers[owner]))

    def _called(self, i: int) -> tuple[keras.layers.Layer, int]:
        """What layer i's call calls, a layer called before (the one layer, or one inside an earlier
        layer): its clone on this stage, the layer borrowed on this device, or a copy made here (its
        gradients summed with the others'); and the index of the layer whose weights it holds."""
        c = self.c
        first = self.first_call[id(c.layers[i])]
        if first != i:
            return self.holder(first), first
        owner, path = c.within[i]
        if owner in self.copies or owner in self.lent or self.piece.borrows(owner):
            inner = self.holder(owner)
            for attr in path:
                inner = getattr(inner, attr)
            return inner, owner
        if i not in self.copies:  # the holder is on another device's stage: a copy of the inner layer alone
            self.copies[i] = _holder_copy(c, i, self.policy)
        return self.copies[i], i


class Piece:
    """The body of the stage holding layers [start, end) of `c` (both allowed cut points), a `Body`.

    Called inside the stage's device scope on the shape crossing into it: re-creates each
    layer (in the stage's dtype policy; the model's last layer in `last_policy`, float32 by
    default, as the chain's read-outs are), re-binds tied weights to the stage's copies,
    replays the model's calls among them, copies their weights. What it builds depends only on
    the cut, the stage's index and `holders` (`placed`): it may be built before, after or without
    the other stages. After the call, `shared` holds the stage's copies of the model's tied weights
    and `borrowed` the ones it reads from an earlier stage on its device.
    """

    def __init__(
        self, c: Cuttable, start: int, end: int, last_policy: Any = None, holders: Holders | None = None, index: int = 0
    ):
        self.c, self.start, self.end, self.last_policy = c, start, end, last_policy
        self.holders, self.index = holders, index  # where the tied weights live (None: unplaced, never borrows)
        self.shared: tuple[SharedCopy, ...] = ()
        self.borrowed: tuple[SharedCopy, ...] = ()  # tied weights read from an earlier stage on its device
        self.policy: Any = None  # the stage's dtype policy, once called

    def placed(self, holders: Holders, index: int) -> Piece:
        """This piece as stage `index` of a chain whose tied weights live as `holders` says."""
        return Piece(self.c, self.start, self.end, self.last_policy, holders, index)

    def borrows(self, owner: int) -> bool:
        """Whether this stage reads layer `owner`'s layer from its home, an earlier stage on its device."""
        return self.holders is not None and self.holders.borrows(self.index, owner)

    def lent_layer(self, owner: int, policy: Any) -> keras.layers.Layer:
        """The one layer object of lent layer `owner`, made on first use by whichever stage sharing it is built
        first (inside its device scope: the home's), the same way."""
        return self.holders.layer(owner, lambda: _holder_copy(self.c, owner, policy))

    def __call__(self, input_shape: tuple, policy: Any, name: str) -> keras.Model:
        self.policy = policy
        inputs, given = self._inputs(input_shape)
        b = _Build(self, policy, given)
        if self.start == 0:
            _run_ops(self.c, -1, b.made)
        for i in range(self.start, self.end):
            b.add(i)
            _run_ops(self.c, i, b.made)
        model = keras.Model(inputs, self._outputs(b.made), name=name)
        self.shared, self.borrowed = self._held(b.clones, b.again_lent, b.lent)
        return model

    def _outputs(self, made: Made) -> Any:
        """The stage model's output: each tensor crossing its end, then its implicit mask (if it carries one)."""
        leaves = []
        for t in self.c.boundary[self.end]:
            leaves.append(made[id(t)])
            if (self.end, id(t)) in self.c.masked:
                leaves.append(MaskOf(name=f"mask_of_{len(leaves) - 1}")(made[id(t)]))
        return leaves[0] if len(leaves) == 1 else leaves

    def _held(
        self,
        clones: list[tuple[int, keras.layers.Layer, keras.layers.Layer]],
        again_lent: list[keras.layers.Layer],
        lent: dict[int, keras.layers.Layer],
    ) -> tuple[tuple[SharedCopy, ...], tuple[SharedCopy, ...]]:
        """The model's weights copied into `clones` (but those `lent` by an earlier stage on this device);
        this stage's copies of tied weights (`shared`) and the lent weights it calls (`borrowed`)."""
        c = self.c
        shared: dict[str, SharedCopy] = {}
        borrowed: dict[str, SharedCopy] = {}
        for _, clone, layer in clones:
            held = [v for v in layer.weights if c.tied.get(id(v), -1) not in lent]
            if len(held) == len(layer.weights):
                clone.set_weights(layer.get_weights())
            else:  # the model's weights but the lent ones, which the earlier stage's layer holds
                for v, copy in zip(held, clone.weights, strict=True):
                    copy.assign(v)
            for v, copy in zip(held, clone.weights):
                if id(v) in c.tied:
                    shared.setdefault(v.path, SharedCopy(v.path, copy))
        for layer in [x for _, _, x in clones] + again_lent:
            for v in layer.weights:
                owner = c.tied.get(id(v), -1)
                if owner in lent:
                    own = lent[owner].weights[[id(w) for w in c.layers[owner].weights].index(id(v))]
                    borrowed.setdefault(v.path, SharedCopy(v.path, own))
        return tuple(shared.values()), tuple(borrowed.values())

    def _inputs(self, input_shape: tuple) -> tuple[Any, dict[int, Any]]:
        """The stage model's input(s) (one tensor, or a list: several tensors and masks cross into it)
        and the model's tensors they stand for (each masked one carrying its mask again)."""
        c, crossing = self.c, self.c.boundary[self.start]
        if self.start == 0 and (len(crossing) > 1 or named(c.model) is not None):  # the model's own inputs (a dict,
            # as keras_hub's, even of one key: a batch is matched to it by name), named as its
            struct = c.model.input
            flat = keras.tree.flatten(struct)
            new = [keras.Input(tuple(t.shape[1:]), dtype=t.dtype, name=t.name) for t in flat]
            return keras.tree.pack_sequence_as(struct, new), {id(t): n for t, n in zip(flat, new)}
        if len(crossing) == 1 and (self.start, id(crossing[0])) not in c.masked:  # the shape the previous stage gives
            inp = keras.Input(tuple(input_shape), dtype=_kept_dtype(crossing[0]))  # token ids stay integers
            return inp, {id(crossing[0]): inp}
        given = list(input_shape) if isinstance(input_shape, list) else []  # the previous stage's leaves' shapes

        def shape(t: Any) -> tuple:  # the graph's shape, its open sizes (None) as the previous stage gives them
            own = tuple(t.shape[1:])
            prev = tuple(given[len(inputs)]) if len(given) > len(inputs) else ()
            return tuple(p if d is None else d for d, p in zip(own, prev)) if len(prev) == len(own) else own

        inputs, made = [], {}
        for t in crossing:
            inputs.append(keras.Input(shape(t), dtype=_kept_dtype(t)))
            made[id(t)] = inputs[-1]
            if (self.start, id(t)) in c.masked:
                mask = keras_mask(t)
                inputs.append(keras.Input(shape(mask), dtype=mask.dtype))
                made[id(t)] = WithMask()([made[id(t)], inputs[-1]])
        return inputs, made

    def whole(self) -> keras.Model:
        """The uncut model re-created (every layer of `c` in one model, named as the user's, in this
        piece's dtype policy, with the user's initial weights): each tied weight is one variable
        again, as in the user's model. The export sets the trained weights into it."""
        c = self.c
        return Piece(c, 0, len(c.layers), self.last_policy)(c.input_shape, self.policy, c.model.name)


def passed(model: keras.Model) -> tuple | list[tuple]:
    """What a stage's (or piece's) model gives the next, as the next one's body takes it: one example's
    shape, or a list of them (several tensors, a mask, crossing)."""
    if isinstance(model.output_shape, list):
        return [tuple(s[1:]) for s in model.output_shape]
    return tuple(model.output_shape[1:])


def piece(c: Cuttable, start: int, end: int, last_policy: Any = None) -> Body:
    """The body of the stage holding layers [start, end) of `c` (`Piece`)."""
    return Piece(c, start, end, last_policy)


def pieces(c: Cuttable, sizes: Sequence[int]) -> list[Body]:
    """One body per stage for layers per stage `sizes`."""
    bounds = [0, *balance.sizes_to_cuts(sizes), len(c.layers)]
    return [piece(c, a, b, keras.DTypePolicy("float32")) for a, b in zip(bounds, bounds[1:])]


def placed(bodies: Sequence[Body | None], devices: Sequence[str | None]) -> list[Body | None]:
    """`bodies` (stage k's on `devices[k]`) with each piece of a cut model given, before any is built,
    where the model's tied weights live (`Holders`: the stage holding each first holder, and so which
    stages borrow it and which copy it). The pieces given are left as they are."""
    cut = [(k, b) for k, b in enumerate(bodies) if isinstance(b, Piece)]
    if not cut:
        return list(bodies)
    layers = {k: range(b.start, b.end) for k, b in cut}
    devices = [None if d is None else canonical(d) for d in devices]
    holders = Holders.placed(set(cut[0][1].c.tied.values()), layers, devices)
    return [b.placed(holders, k) if isinstance(b, Piece) else b for k, b in enumerate(bodies)]


def describe(c: Cuttable, start: int, end: int) -> str:
    """`model.keras[3:6]`-style label of a stage's layers, for the placement table."""
    return f"{c.name} layers {start}-{end - 1} ({c.layers[start].name}..{c.layers[end - 1].name})"
