"""Keras' implicit masks across a cut: a stage whose outgoing tensor carries a mask
(`Embedding(mask_zero=True)` and every mask-propagating layer after it) sends the mask as one
more (boolean) tensor, and the next stage attaches it to its incoming tensor again, so its layers
see the mask the uncut model's layers saw. Without this, the mask would be dropped at the cut
and the next stage would attend to and average over the padding.

Which masks cross is read from Keras running the uncut model, not from its graph: the graph records
a mask after every layer that propagates one, but when the model runs, a layer may clear the masks of
its inputs (`MultiHeadAttention.call` does, so an `Add` of its input and output carries none, and a
later attention block masks nothing). `carried` runs the model once on a padded probe batch and
sends a mask across a cut only where Keras' own run carries one to the first layer after the cut.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import keras
import numpy as np

from chain.errors import ConfigError, first_line
from chain.internals.keras_private import keras_mask, plain_functional, run_nodes


PROBE_LENGTH = 4  # a sequence axis of open size (None) in the probe batch


def probe_batch(inputs: Any) -> Any:
    """Two examples for a model taking `inputs` (its `Input` tensors, in their structure): ones, the second
    example's later half along the sequence axis zeros (the padding `Embedding(mask_zero=True)` and
    `Masking` mask)."""

    def one(t: Any) -> Any:
        shape = [2, *(PROBE_LENGTH if d is None else d for d in t.shape[1:])]
        x = np.ones(shape, dtype=keras.backend.standardize_dtype(t.dtype))
        if len(shape) > 1:
            x[1, shape[1] // 2 :] = 0
        return keras.ops.convert_to_tensor(x)

    return keras.tree.map_structure(one, inputs)


@dataclass(frozen=True)
class Call:
    """One node's call in Keras' run of the model: the node, and whether each tensor it takes (by id of
    the model's tensor) carries an implicit mask at that moment."""

    node: Any
    masked: dict[int, bool]


def observe(graph: keras.Model, key: Callable[[Any], int]) -> tuple[list[Call], dict[int, Any]]:
    """Keras' inference run of `graph` on `probe_batch`, a plain functional model inside it walked through
    as well: every node's call in order (`Call`), and each of the model's tensors' value (by `key`, the id
    of the tensor it stands for). The masks are read as each call begins, before the layer can clear them."""
    calls: list[Call] = []
    values: dict[int, Any] = {}

    def wrap(node: Any, call: Callable) -> Callable:
        def run(*args: Any, **kwargs: Any) -> Any:
            given = zip(
                keras.tree.flatten((node.arguments.args, node.arguments.kwargs)), keras.tree.flatten((args, kwargs))
            )
            calls.append(
                Call(node, {key(t): keras_mask(x) is not None for t, x in given if isinstance(t, keras.KerasTensor)})
            )
            if plain_functional(node.operation) and len(args) == 1:  # a nested model: its own nodes' calls
                out = run_nodes(node.operation, args[0], wrap, training=False)
            else:
                out = call(*args, **kwargs)
            values.update({key(t): y for t, y in zip(node.outputs, keras.tree.flatten(out))})
            return out

        return run

    batch = probe_batch(graph.input)
    values.update({key(t): x for t, x in zip(graph.inputs, keras.tree.flatten(batch))})
    run_nodes(graph, batch, wrap, training=False)
    return calls, values


def carried(
    graph: keras.Model,
    crossing: dict[int, list[int]],
    where: dict[int, int],
    key: Callable[[Any], int],
    describe: Callable[[int], str],
    recorded: Callable[[int], bool],
    name: str,
) -> tuple[frozenset[tuple[int, int]], dict[int, str]]:
    """(position, tensor) for each tensor (`crossing[position]`, by id) that carries an implicit mask across
    a cut when Keras runs `graph`: the mask it carries as the first call after the cut (`where`: id(node) ->
    its layer's index, or the index of the layer an op runs after) takes it. Also the positions where a cut
    cannot carry Keras' masks exactly, each with why (`describe(t)`: a tensor in words; `recorded(t)`: whether
    the graph records a mask on it, which gives the mask's shape on the next stage)."""
    try:
        calls, values = observe(graph, key)
    except Exception as e:  # the user's layers may raise anything on the probe
        raise ConfigError(
            f"{name} carries a Keras mask across its cuts, and chain runs it once on a padded probe "
            "batch (ones, then zeros) to see which masks Keras keeps when the model runs; that run "
            f"failed: {first_line(e)}"
        ) from None
    placed = [(where[id(call.node)], call) for call in calls if id(call.node) in where]
    masked: set[tuple[int, int]] = set()
    refused: dict[int, str] = {}
    for c, ts in crossing.items():
        for t in ts:
            first = next((k for k, (w, call) in enumerate(placed) if w >= c and t in call.masked), None)
            if first is None or not placed[first][1].masked[t]:
                continue
            alias = next((u for u in ts if u != t and values[u] is values[t]), None)
            if any(w < c and t in call.masked for w, call in placed[first + 1 :]):
                refused.setdefault(
                    c,
                    f"{describe(t)} carries a Keras mask to the layers after the cut, but a layer "
                    "before the cut runs later and may clear it",
                )
            elif not recorded(t):
                refused.setdefault(
                    c, f"Keras attaches a mask to {describe(t)} when the model runs, which its graph does not record"
                )
            elif alias is not None:  # a layer clearing one's mask clears the other's: not so across a cut
                refused.setdefault(
                    c,
                    f"{describe(t)} and {describe(alias)} are one tensor when Keras runs the model (a "
                    "layer returned its input), but two across the cut, which Keras would mask apart",
                )
            masked.add((c, t))
    return frozenset(masked), refused
