"""`data=tfrecord`: the user's TFRecord files of `tf.train.Example`s: its settings, description and
reader. Only TensorFlow reads the records (`chain.data.tensors.records`, imported when they are
read), so the description checks what it can without it (the globs match files, the features
read are declared) and the data set is described from its arrays once read."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from chain.data import files
from chain.data.catalog import DataInfo, target_keys, val_fraction
from chain.data.data_source import Labelled, Read, Source, from_files
from chain.errors import ConfigError
from chain.fields import feature, mapping, optional, required, setting, string


@dataclass(frozen=True, kw_only=True)
class TFRecord(Labelled):
    """TFRecord files of `tf.train.Example`s (`files`, a glob): `features` declares every feature
    read (name -> `float32[d1,...]` or `int64`), `x` the input feature; `val_files` an optional
    glob for validation."""

    KIND: ClassVar[str] = "tfrecord"
    files: str = setting(required(string, "data=tfrecord data.files='DIR/*.tfrecord'"),
        "a glob of TFRecord files of tf.train.Example (required)")
    val_files: str | None = setting(optional(string), "a glob of TFRecord files for validation")
    x: str = setting(string, "the feature holding the inputs")
    features: tuple[tuple[str, tuple], ...] = setting(
        required(mapping(feature), "data.features={x: 'float32[8]', label: int64} (every feature read)"),
        "every feature read: {name: float32[d1,...] or int64} (required)")


def describe(data: TFRecord) -> None:
    """None (only TensorFlow reads the records), after checking what can be checked without it."""
    features = dict(data.features)
    files.matching(data.files, "data.files")
    if data.val_files is not None:
        files.matching(data.val_files, "data.val_files")
    val_fraction(data)
    for key, where in [(data.x, "data.x")] + [(k, w) for _, k, w in target_keys(data)]:
        if key not in features:
            raise ConfigError(f"{where}={key!r} is not in data.features ({', '.join(features)}); declare every "
                              "feature read, e.g. data.features={x: 'float32[8]', label: int64}")
    return None


def read(data: TFRecord, seed: int, info: DataInfo | None = None) -> Read:
    """The records of `data.files` (and `data.val_files`), parsed by TensorFlow."""
    from chain.data import tensors

    return from_files(data, lambda path, key: tensors.records(data, path, key), "files", "val_files",
                      [name for name, _, _ in target_keys(data)])


SOURCE = Source(TFRecord, describe, read)
