"""Example inputs for timing a model's links (`chain.autoplan.measure` for `placement.plan=auto`,
`chain.stages.timing` for `placement.balance=time`): what each link really takes, made from its input
signature and the data description.

A link's inputs are one tensor, a list (a tensor and its Keras mask crossing a cut, `chain.stages.masks`;
every tensor crossing a cut mode=e2e sends, as keras_hub's `padding_mask` beside the hidden state) or, for a
model's first link, the model's own inputs (keras_hub's dict `{"token_ids", "padding_mask"}`).
Each leaf is made by its kind: floats normal; integer ids uniform in 0..vocab-1 (the data's vocabulary,
`Feed.vocab`), as are float inputs an `Embedding` reads (ids given as floats); booleans (a mask) and
keras_hub's filled inputs (`chain.stages.named_inputs.FILLED`: a `padding_mask` of ones, `segment_ids` of
zeros) as the config's full windows give them. The first link's open sizes (None) are the data's
example's; each later link's input is what the link before it gives (`link_signatures`: each link run once on
one example), so every size, dtype and mask is the one a step passes, and the ids and masks a link makes (position
ids, a mask from the ids) have the values it gave.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Sequence

import keras
import tensorflow as tf

from chain.config.schema import Gpt, Settings
from chain.data.catalog import DataInfo
from chain.internals.keras_private import graph_nodes
from chain.stages.named_inputs import FILLED

FLOAT_VOCAB = 2  # ids 0..1 where neither the data nor the model bounds them: within any vocabulary


@dataclass(frozen=True)
class Feed:
    """What a model's first link is fed: one example's shape (`shape`, the model's open sizes taken from
    it by axis) and the vocabulary its integer inputs are ids of (`vocab`: ids 0..vocab-1)."""

    shape: tuple[int, ...]
    vocab: int = FLOAT_VOCAB


@dataclass(frozen=True)
class Leaf:
    """One input tensor of a link: one example's `shape`, its `dtype`, and `fill`, the value of every
    position (a mask's 1, keras_hub's `padding_mask` 1 and `segment_ids` 0), or `example`, one example's values
    (flat) for every example (what an earlier link gave without a gradient: position ids, a mask made from the
    ids), or neither: drawn at random, whole numbers 0..vocab-1 for integers and for `ids` (floats an
    `Embedding` reads)."""

    shape: tuple[int, ...]
    dtype: str
    fill: int | None = None
    ids: bool = False
    example: tuple[int, ...] | None = None


def feed(settings: Settings, info: DataInfo, layers: Sequence[keras.layers.Layer] = ()) -> Feed:
    """The `Feed` of `settings`' model on data described by `info`: the ids' vocabulary from the data (a
    target of a class per position: `data.vocab`, data=text's bytes or tokenizer) or `model.vocab`
    (model=gpt), else the least `input_dim` of the model's `Embedding` `layers` (the ids it can take)."""
    vocab = [t.classes for t in info.targets if t.shape and t.classes]
    model = settings.stages[0].model
    if isinstance(model, Gpt):
        vocab.append(model.vocab)
    if not vocab:
        vocab = [layer.input_dim for layer in layers if isinstance(layer, keras.layers.Embedding)]
    return Feed(tuple(info.input_shape), min(vocab) if vocab else FLOAT_VOCAB)


def first(model: keras.Model, given: Feed) -> Any:
    """The `Leaf` structure of `model`'s inputs (its `Input` tensors in their structure) on the data `given`
    describes."""
    ids = _embedded(model)

    def leaf(t: Any, name: str | None) -> Leaf:
        shape = tuple(
            d if d is not None else (given.shape[i] if i < len(given.shape) else 1) for i, d in enumerate(t.shape[1:])
        )
        dtype = keras.backend.standardize_dtype(t.dtype)
        return Leaf(shape, dtype, 1 if dtype == "bool" else FILLED.get(name), id(t) in ids)

    inputs = model_inputs(model)
    if isinstance(inputs, dict):
        return {k: leaf(t, k) for k, t in inputs.items()}
    return keras.tree.map_structure(lambda t: leaf(t, None), inputs)


def model_inputs(model: keras.Model) -> Any:
    """`model`'s `Input` tensors in their structure; a Sequential never called (its input not made): one float
    tensor of its input's shape."""
    try:
        return model.input
    except AttributeError:
        return keras.KerasTensor(model.input_shape, "float32")


def _embedded(model: keras.Model) -> set[int]:
    """The ids of `model`'s input tensors an `Embedding` layer of its graph takes (a functional model's;
    none of a model whose graph is Python code)."""
    try:
        nodes = graph_nodes(model)
    except AttributeError:
        return set()
    return {id(t) for node in nodes if isinstance(node.operation, keras.layers.Embedding) for t in node.input_tensors}


def make(signature: Any, size: int, vocab: int, seed: Any = (0, 0)) -> Any:
    """`size` examples of `signature` (a `Leaf` structure): the tensors in the same structure. `seed`:
    two integers (or a tensor of two), each leaf's drawn from it."""
    base = tf.cast(tf.convert_to_tensor(seed), tf.int32)
    leaves = keras.tree.flatten(signature)

    def one(k: int, leaf: Leaf) -> tf.Tensor:
        shape = (size, *leaf.shape)
        dtype = tf.as_dtype(leaf.dtype)
        if leaf.fill is not None:
            return tf.fill(shape, tf.cast(leaf.fill, dtype))
        if leaf.example is not None:
            return tf.tile(
                tf.reshape(tf.constant(leaf.example, dtype), (1, *leaf.shape)), (size,) + (1,) * len(leaf.shape)
            )
        at = base + tf.constant([0, 7919 * k])
        if dtype.is_floating and not leaf.ids:
            return tf.random.stateless_normal(shape, seed=at, dtype=dtype)
        if dtype.is_integer or leaf.ids:
            wide = tf.int64 if dtype.size > 4 or dtype == tf.uint32 else tf.int32
            ids = tf.random.stateless_uniform(shape, seed=at, minval=0, maxval=vocab, dtype=wide)
            return tf.cast(ids, dtype)
        return tf.cast(tf.random.stateless_uniform(shape, seed=at) < 0.5, dtype)

    return keras.tree.pack_sequence_as(signature, [one(k, leaf) for k, leaf in enumerate(leaves)])


def given(model: keras.Model, signature: Any, vocab: int) -> Any:
    """The `Leaf` structure of what `model` gives on `signature` (run once on one example, inference): the next
    link's input. A tensor it passes on as it took it (keras_hub's `padding_mask`, crossing every cut between
    blocks): the `Leaf` it was made from; one it made without a gradient (position ids, a mask): its values
    (`Leaf.fill` when they are all one, else `Leaf.example`), which the next link may index by; a float: drawn."""
    x = make(signature, 1, vocab)
    took = {id(t): leaf for t, leaf in zip(keras.tree.flatten(x), keras.tree.flatten(signature))}

    def leaf(t: Any) -> Leaf:
        if id(t) in took:
            return took[id(t)]
        dtype = keras.backend.standardize_dtype(t.dtype)
        shape = tuple(int(d) for d in t.shape[1:])
        if keras.backend.is_float_dtype(dtype):
            return Leaf(shape, dtype)
        seen = tuple(int(v) for v in keras.ops.convert_to_numpy(t)[0].ravel())
        return Leaf(shape, dtype, seen[0] if seen else 0) if len(set(seen)) <= 1 else Leaf(shape, dtype, example=seen)

    return keras.tree.map_structure(leaf, model(x, training=False))


def link_signatures(models: Sequence[keras.Model], fed: Feed) -> list[Any]:
    """Each of `models`' input signatures (a chain: each takes what the one before gives) and, last, the
    last one's output's: the first from its inputs and `fed`, each next from the one before (`given`)."""
    out = [first(models[0], fed)]
    for m in models:
        out.append(given(m, out[-1], fed.vocab))
    return out


def values(signature: Any) -> int:
    """Values per example in `signature` (every leaf, masks and ids included)."""
    return sum(math.prod(leaf.shape) for leaf in keras.tree.flatten(signature))


def floating(signature: Any) -> list[Leaf]:
    """The float leaves of `signature`, in order: what carries a gradient."""
    return [leaf for leaf in keras.tree.flatten(signature) if tf.as_dtype(leaf.dtype).is_floating]


def floats_of(tensors: Any) -> list:
    """The float tensors of a structure of `tensors`, in order (what carries a gradient: not ids, nor masks)."""
    return [t for t in keras.tree.flatten(tensors) if t.dtype.is_floating]


def spec(signature: Any) -> Any:
    """`signature` as `tf.TensorSpec`s of any batch size (a compiled function's input signature)."""
    return keras.tree.map_structure(lambda leaf: tf.TensorSpec((None, *leaf.shape), tf.as_dtype(leaf.dtype)), signature)
