"""`data=callable`: the user's function returning a finite `tf.data.Dataset`: its settings,
description and reader. Only TensorFlow reads it (`function_read.call`, imported when it is
read), so the data set is described from its arrays once read.

With `data.stream=true` the dataset is used as it is, never read whole
(`function_stream`): described from its element spec, `data.classes` and its size."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from chain.data.catalog import DataInfo
from chain.data.data_source import MAX_BATCH, MAX_CLASSES, DataSet, Read, Source, StreamSettings
from chain.data.sources.function.function_record import FunctionData
from chain.data.streamed import Streamed, refuse_share
from chain.fields import dotted_name, integer, mapping, number, optional, required, setting


@dataclass(frozen=True, kw_only=True)
class FromCallable(StreamSettings, DataSet):
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
    examples: int | None = setting(
        optional(integer(1, MAX_BATCH)),
        "data.stream=true: the dataset's number of examples when TensorFlow cannot tell; null: counted (a pass)",
    )
    kwargs: dict = field(default_factory=dict)


class FunctionStream(FunctionData, Streamed):
    """The user's dataset streamed as it is, opening its stream (`function_stream`)."""

    @property
    def examples(self) -> int:
        return self.info.examples

    def training(self, batch, shuffle, seed, skipped=None, share=None):
        from chain.data.sources.function import function_stream

        refuse_share(share)
        return function_stream.training(self, batch, shuffle, seed)

    def validation(self, batch, skipped=None):
        from chain.data.sources.function import function_stream

        return function_stream.validation(self, batch)


def describe(data: FromCallable) -> None:
    """None: the function's examples are known once it is called, with TensorFlow."""
    return None


def read(data: FromCallable, seed: int, info: DataInfo | None = None) -> Read:
    """Every example of the function's dataset (bounded by `max_examples` and `read_timeout_s`)."""
    from chain.data.sources.function import function_read

    return Read(*function_read.call(data))


def shards(data: FromCallable) -> FunctionStream:
    """What a stream (`data.stream=true`) uses: the function's dataset, described
    (`function_stream.plan`, with TensorFlow)."""
    from chain.data.sources.function import function_stream

    return function_stream.plan(data, FunctionStream)


SOURCE = Source(FromCallable, describe, read, shards)
