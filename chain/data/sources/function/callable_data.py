"""`data=callable`: the user's function returning a finite `tf.data.Dataset`: its settings,
description and reader. Only TensorFlow reads it (`chain.data.tensors.call`, imported when it is
read), so the data set is described from its arrays once read.

With `data.stream=true` the dataset is used as it is, never read whole
(`chain.data.function_stream`): described from its element spec, `data.classes` and its size."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from chain.data.catalog import DataInfo
from chain.data.data_source import MAX_BATCH, MAX_CLASSES, DataSet, Read, Source
from chain.fields import boolean, dotted_name, integer, mapping, number, optional, required, setting


@dataclass(frozen=True, kw_only=True)
class FromCallable(DataSet):
    """The user's function (`_target_`, called through Hydra) returning a finite `tf.data.Dataset`
    of `(x, y)` or `(x, {name: y})` examples; every other key is a keyword argument of it.
    Reading it is bounded: at most `max_examples` examples, and no more than `read_timeout_s`
    seconds without a batch of them (a dataset that never ends, or yields nothing, is refused)."""

    KIND: ClassVar[str] = "callable"
    SELECTED_BY: ClassVar[str] = "_target_"
    EXTRA: ClassVar[str] = "kwargs"
    _target_: str = setting(
        required(dotted_name, "data=callable data._target_=mypackage.data.make_dataset"),
        "your function's import path (checked to be callable before the run), called through Hydra; its arguments "
        "are +data.ARG keys (required)",
    )
    classes: tuple[tuple[str, int], ...] | None = setting(
        optional(mapping(integer(0, MAX_CLASSES))),
        "a target's kind: {name: number of classes, or 0 for a real value}; default from its dtype",
    )
    max_examples: int = setting(integer(1, MAX_BATCH), "more examples than this is refused (an endless dataset?)")
    read_timeout_s: float = setting(
        number(positive=True, maximum=86400.0), "seconds the read may wait for a batch of examples"
    )
    stream: bool = setting(
        boolean,
        "use the dataset as it is while training instead of reading it whole (data "
        "larger than memory; it must be checkpointable: no Python generator or py_function); "
        "needs data.classes for integer targets",
    )
    examples: int | None = setting(
        optional(integer(1, MAX_BATCH)),
        "data.stream=true: the dataset's number of examples when TensorFlow cannot tell; null: counted (a pass)",
    )
    shuffle_buffer: int = setting(
        integer(1, MAX_CLASSES),
        "data.stream=true: examples in the shuffle buffer (host memory, and the size of every checkpoint)",
    )
    kwargs: dict = field(default_factory=dict)


def describe(data: FromCallable) -> None:
    """None: the function's examples are known once it is called, with TensorFlow."""
    return None


def read(data: FromCallable, seed: int, info: DataInfo | None = None) -> Read:
    """Every example of the function's dataset (bounded by `max_examples` and `read_timeout_s`)."""
    from chain.data import tensors

    return Read(*tensors.call(data))


def shards(data: FromCallable):
    """What a stream (`data.stream=true`) uses: the function's dataset, described
    (`chain.data.function_stream.plan`, with TensorFlow)."""
    from chain.data import function_stream

    return function_stream.plan(data)


SOURCE = Source(FromCallable, describe, read, shards)
