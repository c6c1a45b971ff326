"""TFRecord files read whole into NumPy with TensorFlow (`data=tfrecord`, not streamed), once, at
build time; a file cut inside a record is refused (TensorFlow would stop at the cut without a word)."""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from chain.data.catalog import target_keys
from chain.data.paths import matching
from chain.data.sources.tfrecord import tfrecord_files
from chain.data.tensors import gather
from chain.errors import ConfigError


def records(data, pattern: str, key: str) -> tuple[np.ndarray, list[np.ndarray], list[str]]:
    """The inputs and targets held by the TFRecord files of the glob `pattern` (`key` names it),
    parsed with `data.features`, and what each was read from."""
    spec = {
        name: tf.io.FixedLenFeature(shape, tf.float32 if dtype == "float32" else tf.int64)
        for name, (dtype, shape) in data.features
    }
    keys = target_keys(data)
    paths = matching(pattern, key)
    # TensorFlow's reader stops without a word at a file cut inside a record's header: count them.
    whole = sum(tfrecord_files.whole_records(p, f"{key}={pattern!r}") for p in paths)
    parsed = tf.data.TFRecordDataset(paths).map(lambda r: tf.io.parse_single_example(r, spec))
    arrays = gather(parsed, f"{key}={pattern!r} with data.features")
    if whole != len(arrays[data.x]):
        raise ConfigError(
            f"{key}={pattern!r}: TensorFlow read {len(arrays[data.x])} records, but the files hold {whole}"
        )
    where = [f"data.x={data.x!r} of {pattern}"] + [f"{w}={k!r}" for _, k, w in keys]
    return arrays[data.x], [arrays[k] for _, k, _ in keys], where
