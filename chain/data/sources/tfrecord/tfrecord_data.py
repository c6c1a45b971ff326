"""`data=tfrecord`: the user's TFRecord files of `tf.train.Example`s: its settings, description and
reader. Only TensorFlow reads the records (`tfrecord_read.records`, imported when they are
read), so the description checks what it can without it (the globs match files, the features
read are declared) and the data set is described from its arrays once read.

With `data.stream=true` the records are never loaded: the description comes from the declared
features (the input's shape), `data.classes` (each class target's number of classes) and a count
of the records (`tfrecord_record.count`), and `shards` says what `tfrecord_stream` reads."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import ClassVar

from chain.data.paths import matching
from chain.data.sources.tfrecord import tfrecord_files
from chain.data.catalog import (
    DataInfo,
    increasing_buckets,
    Target,
    label_shape,
    no_other_classes,
    stream_classes,
    target_keys,
    val_fraction,
)
from chain.data.data_source import BadRecords, Labelled, Read, Source, from_files
from chain.data.sources.tfrecord.tfrecord_record import IdRange, Shards, count
from chain.data.streamed import Streamed, none_empty, refuse_share, stream_files
from chain.errors import ConfigError
from chain.fields import feature, integer, list_of, mapping, optional, required, setting, string


@dataclass(frozen=True, kw_only=True)
class TFRecord(BadRecords, Labelled):
    """TFRecord files of `tf.train.Example`s (`path`, a glob): `features` declares every feature
    read (name -> `float32[d1,...]` or `int64`), `x` the input feature; `val_path` an optional
    glob for validation."""

    KIND: ClassVar[str] = "tfrecord"
    path: str = setting(
        required(string, "data=tfrecord data.path='DIR/*.tfrecord'"),
        "a glob of TFRecord files of tf.train.Example (required)",
    )
    val_path: str | None = setting(optional(string), "a glob of TFRecord files for validation")
    x: str = setting(string, "the feature holding the inputs")
    features: tuple[tuple[str, tuple], ...] = setting(
        required(mapping(feature), "data.features={x: 'float32[8]', label: int64} (every feature read)"),
        "every feature read: {name: float32[d1,...] or int64, or int64[None]: ids of any length} (required)",
    )
    buckets: tuple[int, ...] | None = setting(
        optional(list_of(integer(1, 1 << 20), 1)),
        "an int64[None] input (data.stream=true): increasing lengths, each batch padded with 0 to the first its "
        "examples fit; longer examples cut to the last",
    )

    @property
    def lengths_vary(self) -> bool:
        """An input of any length (`int64[None]`), in length buckets."""
        return any(None in shape for _, (_, shape) in self.features)


class TFRecordStream(Shards, Streamed):
    """TFRecord files streamed, opening their stream (`tfrecord_stream`); mirrored replicas can each
    read their own files."""

    SHARES = True

    def training(self, batch, shuffle, seed, skipped=None, share=None):
        from chain.data.sources.tfrecord import tfrecord_stream, tfrecord_varlen

        if self.buckets is not None:
            refuse_share(share)
            return tfrecord_varlen.training(self, batch, shuffle, seed)
        return tfrecord_stream.training(self, batch, shuffle, seed, skipped, share)

    def validation(self, batch, skipped=None):
        from chain.data.sources.tfrecord import tfrecord_stream, tfrecord_varlen

        if self.buckets is not None:
            return tfrecord_varlen.validation(self, batch)
        return tfrecord_stream.validation(self, batch, skipped)

    def skip_counter(self):
        from chain.data.sources.tfrecord import tfrecord_stream

        return tfrecord_stream.skip_counter(self)

    def bad_record(self, error):
        from chain.data.sources.tfrecord import tfrecord_stream

        return tfrecord_stream.bad_record(error, self)

    def check_ids(self, data, vocab, target, ignored=None):
        """Records are read only while training: the stream checks each chunk's ids (`Shards.ids`)."""
        feature = dict((name, key) for name, key, _ in self.targets)[target]
        return replace(self, ids=IdRange(vocab, feature, ignored))


def describe(data: TFRecord) -> None:
    """None (only TensorFlow reads the records), after checking what can be checked without it."""
    features = dict(data.features)
    matching(data.path, "data.path")
    if data.val_path is not None:
        matching(data.val_path, "data.val_path")
    val_fraction(data)
    for key, where in [(data.x, "data.x")] + [(k, w) for _, k, w in target_keys(data)]:
        if key not in features:
            raise ConfigError(
                f"{where}={key!r} is not in data.features ({', '.join(features)}); declare every "
                "feature read, e.g. data.features={x: 'float32[8]', label: int64}"
            )
    _varlen_checked(data)
    if data.stream:
        s = shards(data)
        longest = (data.buckets[-1],) if data.lengths_vary else ()

        def sized(shape: tuple) -> tuple:  # int64[None]: up to the largest bucket (what memory must hold)
            return longest if None in shape else tuple(shape)

        return DataInfo(
            "tfrecord",
            sized(features[data.x][1]),
            s.examples,
            tuple(Target(name, classes, label_shape(sized(features[key][1]))) for name, key, classes in s.targets),
            s.val_examples,
            lengths_vary=data.lengths_vary,
            padded=data.lengths_vary,
        )
    for key, pattern in (("data.path", data.path), ("data.val_path", data.val_path)):
        for path in matching(pattern, key) if pattern is not None else ():
            _first_as_declared(path, data.features, key)  # TensorFlow's parser would not name the file
    return None


def _varlen_checked(data: TFRecord) -> None:
    """An `int64[None]` feature: the input's, streamed, in `data.buckets` (increasing); one line naming the key."""
    varying = [name for name, (_, shape) in data.features if None in shape]
    if not varying:
        if data.buckets is not None:
            raise ConfigError(
                f"data.buckets needs an input of any length: declare data.x={data.x!r} as int64[None] in data.features"
            )
        return
    if data.x not in varying:
        raise ConfigError(
            f"data.features declares {varying[0]} int64[None], but the input data.x={data.x!r} is of fixed length; "
            "an int64[None] feature is the input (or a label per position of it)"
        )
    if not data.stream or data.buckets is None:
        raise ConfigError(
            f"data.features declares {data.x} int64[None] (ids of any length): it needs data.stream=true and "
            "data.buckets=[...] (increasing lengths, e.g. [64,128,256])"
        )
    increasing_buckets(data.buckets)


def _stream_targets(data: TFRecord) -> tuple[tuple[str, str, int], ...]:
    """(name, feature, classes) of each target of a stream: int64 features are classes, whose number
    `data.classes` must give (finding it would need a pass over every record); float32 are values."""
    features, given = dict(data.features), dict(data.classes or ())
    out = []
    for name, key, where in target_keys(data):
        dtype, shape = features[key]
        labels = label_shape(shape)
        if len(labels) > 1 or (labels and dtype != "int64"):
            raise ConfigError(
                f"{where}={key!r} is declared {dtype}{list(shape)}; a target holds one value per "
                "example (int64 or float32), or one class label per position (int64[seq])"
            )
        name = name or ("label" if dtype == "int64" else "value")
        classes = stream_classes(
            given,
            name,
            f"the number of classes of {where}={key!r} is known only after reading every record",
            needed=dtype == "int64",
        )
        out.append((name, key, classes))
    no_other_classes(given, "data=tfrecord", [t[0] for t in out])
    return tuple(out)


def _first_as_declared(path: str, features: tuple[tuple[str, tuple], ...], key: str) -> None:
    """One line when the first record of `path` (`key` names its glob) is not as `data.features`
    declares: a feature missing, with another number of values or of another type. A stream reads
    its records while training, so a file of examples unlike the others' would stop the run on its
    first record, or (`data.on_bad_record=skip`) be left out whole; a load's parser would fail
    without naming the file: refused before training, naming it."""
    where = f"{key}: record 0 of {path}"
    record = tfrecord_files.first_record(path)
    if record is None:  # no whole record: a stream refuses it by its count, a load reads none from it
        return
    try:
        held = tfrecord_files.example_features(record)
    except ValueError:
        raise ConfigError(
            f"{where} is not a tf.train.Example; data=tfrecord reads files of tf.train.Example records"
        ) from None
    for name, (dtype, shape) in features:
        kind, n = held.get(name, ("", 0))
        declared = dtype + (f"[{','.join(map(str, shape))}]" if shape else "")
        count_ok = n >= 1 if None in shape else n == math.prod(shape)  # int64[None]: any number, one at least
        if not count_ok or (n and kind != dtype):
            what = f"{n} values" if not n or kind == dtype else f"{n} {kind} values"
            raise ConfigError(
                f"{where} is not as data.features declares it: feature {name} holds {what}, declared "
                f"{declared} (each file's first record is checked before training)"
            )


def shards(data: TFRecord) -> TFRecordStream:
    """What a stream (`data.stream=true`) reads: the training and validation files, their record
    counts, the features and targets. Validation is `data.val_path`, or the last whole files of
    `data.path` in sorted order (`data.val_fraction` of the files, at least one)."""
    targets = _stream_targets(data)
    paths, val, val_key = stream_files(data)
    val_counts = count(val, f"{val_key}={data.val_path or data.path!r}")
    counts = count(paths, f"data.path={data.path!r}")
    none_empty(paths, counts, "data.path", "records")
    none_empty(val, val_counts, val_key, "records", held=data.val_path is None)
    for path in paths + val:
        _first_as_declared(path, data.features, val_key if path in val else "data.path")
    return TFRecordStream(
        tuple(paths),
        counts,
        tuple(val),
        val_counts,
        data.features,
        data.x,
        targets,
        data.shuffle_buffer,
        data.on_bad_record == "skip",
        val_key,
        data.buckets if data.lengths_vary else None,
    )


def read(data: TFRecord, seed: int, info: DataInfo | None = None) -> Read:
    """The records of `data.path` (and `data.val_path`), parsed by TensorFlow (not called for a
    stream: `chain.data.loader.load` asks `shards`)."""
    from chain.data.sources.tfrecord import tfrecord_read

    return from_files(
        data,
        lambda path, key: tfrecord_read.records(data, path, key),
        "path",
        "val_path",
        [name for name, _, _ in target_keys(data)],
    )


SOURCE = Source(TFRecord, describe, read, shards)
