"""`data=keras data.name=mnist|fashion_mnist|cifar10`: a Keras data set read from the local Keras
cache (never downloaded; `keras_cache` reads the cache files): its settings, description and
reader."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from chain.data.sources.keras import keras_cache
from chain.data.catalog import DataInfo, Target, split_info
from chain.data.data_source import DataSet, Read, Source


@dataclass(frozen=True, kw_only=True)
class Keras(DataSet):
    """A Keras data set, read from the local Keras cache (`KERAS_HOME/datasets`), never downloaded."""

    KINDS: ClassVar[tuple[str, ...]] = tuple(keras_cache.KERAS)
    OWN_SPLIT: ClassVar[str] = "the test split"


def describe(data: Keras) -> DataInfo:
    """Its fixed sizes; validation from its test split unless `data.val_fraction` holds some out."""
    keras_cache.keras_files(data.name)  # the cache holds it, or one line on how to fill it
    spec = keras_cache.KERAS[data.name]
    targets = (Target("label", spec.classes),)
    if data.val_fraction is None:
        return DataInfo(data.name, spec.input_shape, spec.train, targets, spec.test)
    return split_info(data.name, spec.input_shape, spec.train, targets, data)


def read(data: Keras, seed: int, info: DataInfo | None = None) -> Read:
    """The training and test arrays of the cache."""
    x, y, x_test, y_test = keras_cache.keras_arrays(data.name)
    where = [f"data.name={data.name} (the Keras cache)"] * 2
    val = (x_test, [y_test]) if data.val_fraction is None else None
    return Read(x, [y], ["label"], where, val, where)


SOURCE = Source(Keras, describe, read)
