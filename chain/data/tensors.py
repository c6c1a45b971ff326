"""The sources only TensorFlow can read, read into NumPy arrays once, at build time: TFRecord
files (`records`, for `data=tfrecord`) and the user's function returning a `tf.data.Dataset`
(`call`, for `data=callable`: resolved and checked by `chain.targets`, then called through Hydra's
`instantiate`).

Reading everything once is what lets every source be checked whole before training (shapes,
label ranges, the number of classes), split deterministically into training and validation
examples, and resumed exactly: afterwards they are arrays like any other source. So the read
is bounded: a TFRecord file cut short is refused (TensorFlow would stop at the cut without a
word), and the user's dataset may give at most `data.max_examples` examples, each batch of them
within `data.read_timeout_s` seconds (a dataset that never ends, or yields nothing, is one line).
"""

from __future__ import annotations

import queue
import threading
from typing import Any, Iterator

import numpy as np
import tensorflow as tf

from chain import targets
from chain.data import files, tfrecord_files
from chain.data.catalog import target_keys
from chain.errors import ConfigError, first_line, instantiate_error

CHUNK = 4096  # examples converted to NumPy at a time


def _within(batches: Iterator, timeout_s: float, what: str) -> Iterator:
    """The items of `batches`, each awaited at most `timeout_s` seconds: TensorFlow's iterator
    cannot be interrupted, so it runs in a thread of its own, which a timeout leaves behind
    (the command line exits; in a Python session it runs on until the process ends)."""
    items: queue.Queue = queue.Queue(maxsize=2)

    def read() -> None:
        try:
            for b in batches:
                items.put(("batch", b))
            items.put(("end", None))
        except BaseException as e:  # noqa: BLE001 (raised again in the caller's thread)
            items.put(("error", e))

    threading.Thread(target=read, name="chain-data-read", daemon=True).start()
    examples = 0
    while True:
        try:
            kind, item = items.get(timeout=timeout_s)
        except queue.Empty:
            raise ConfigError(
                f"{what} gave no example for {timeout_s:g} s (data.read_timeout_s) after {examples} "
                "examples: an endless dataset that yields nothing? (a filter that drops every example "
                "of a repeated dataset) return each example once, or raise data.read_timeout_s"
            ) from None
        if kind == "end":
            return
        if kind == "error":
            raise item
        examples += len(tf.nest.flatten(item)[0])
        yield item


def _gather(
    dataset: tf.data.Dataset, what: str, max_examples: int | None = None, timeout_s: float | None = None
) -> Any:
    """Every element of a finite dataset, batched into NumPy arrays (a structure like its elements).

    `max_examples` and `timeout_s` bound the read of a dataset that may never end: more examples
    than `max_examples`, or `timeout_s` seconds without a batch of them, is one line."""
    if max_examples is not None:
        dataset = dataset.take(max_examples + 1)  # one more than allowed tells "too many" from "exactly"
    batches = dataset.batch(CHUNK).as_numpy_iterator()
    parts = []
    try:
        for batch in batches if timeout_s is None else _within(batches, timeout_s, what):
            parts.append(batch)
    except (tf.errors.OpError, ValueError, TypeError) as e:
        raise ConfigError(f"{what} cannot be read: {first_line(e)}") from None
    if not parts:
        raise ConfigError(f"{what} holds no examples")
    arrays = tf.nest.map_structure(lambda *a: np.concatenate(a), *parts)
    if max_examples is not None and len(tf.nest.flatten(arrays)[0]) > max_examples:
        raise ConfigError(
            f"{what} gave more than data.max_examples={max_examples} examples (an endless dataset?); "
            "return each example once, or raise data.max_examples"
        )
    return arrays


# --- TFRecord --------------------------------------------------------------------------------


def records(data, pattern: str, key: str) -> tuple[np.ndarray, list[np.ndarray], list[str]]:
    """The inputs and targets held by the TFRecord files of the glob `pattern` (`key` names it),
    parsed with `data.features`, and what each was read from."""
    spec = {
        name: tf.io.FixedLenFeature(shape, tf.float32 if dtype == "float32" else tf.int64)
        for name, (dtype, shape) in data.features
    }
    keys = target_keys(data)
    paths = files.matching(pattern, key)
    # TensorFlow's reader stops without a word at a file cut inside a record's header: count them.
    whole = sum(tfrecord_files.whole_records(p, f"{key}={pattern!r}") for p in paths)
    parsed = tf.data.TFRecordDataset(paths).map(lambda r: tf.io.parse_single_example(r, spec))
    arrays = _gather(parsed, f"{key}={pattern!r} with data.features")
    if whole != len(arrays[data.x]):
        raise ConfigError(
            f"{key}={pattern!r}: TensorFlow read {len(arrays[data.x])} records, but the files hold {whole}"
        )
    where = [f"data.x={data.x!r} of {pattern}"] + [f"{w}={k!r}" for _, k, w in keys]
    return arrays[data.x], [arrays[k] for _, k, _ in keys], where


# --- the user's function ---------------------------------------------------------------------


def _call(data) -> tf.data.Dataset:
    """Call the user's function through Hydra's `instantiate` (its checks on targets included), once it is
    resolved and checked to be callable (`chain.targets.function`)."""
    from hydra.utils import instantiate

    what = f"data._target_={data._target_}"
    targets.function("data._target_", data._target_, targets.DATA_FUNCTION_RETURNS)
    try:
        result = instantiate({"_target_": data._target_, **data.kwargs})
    except Exception as e:  # noqa: BLE001 (the user's function may raise anything; Hydra wraps it)
        raise instantiate_error(e, what) from None
    if not isinstance(result, tf.data.Dataset):
        raise ConfigError(f"{what} returned {type(result).__name__}; it must return {targets.DATA_FUNCTION_RETURNS}")
    if result.cardinality() == tf.data.INFINITE_CARDINALITY:
        raise ConfigError(
            f"{what} returned an endless dataset (it repeats); return each example once: chain repeats and shuffles it"
        )
    return result


def function_dataset(data) -> tf.data.Dataset:
    """The user's function's dataset (`data=callable`), its elements checked to be single examples
    `(x, y)` or `(x, {name: y})` of fixed shapes; not read."""
    dataset = _call(data)
    what = f"data._target_={data._target_}"
    spec = dataset.element_spec
    ys = spec[1] if isinstance(spec, tuple) and len(spec) == 2 else None
    ys = list(ys.values()) if isinstance(ys, dict) else [ys]
    if not (
        isinstance(spec, tuple)
        and isinstance(spec[0], tf.TensorSpec)
        and ys
        and all(isinstance(y, tf.TensorSpec) for y in ys)
    ):
        raise ConfigError(
            f"{what} returned a dataset of {spec}; its elements must be (x, y) or (x, {{name: y}}), one example each"
        )
    if not all(s.shape.is_fully_defined() for s in [spec[0], *ys]):
        raise ConfigError(
            f"{what} returned examples of unknown shape ({spec}); every x and every y must have "
            "one fixed shape (do not batch the dataset: chain does)"
        )
    return dataset


def call(data) -> tuple:
    """The fields of a `chain.data.data_source.Read` of the user's function (`data=callable`): its
    inputs, targets, their names (None: a bare y, named by its kind) and where each came from."""
    dataset = function_dataset(data)
    what = f"data._target_={data._target_}"
    x, y = _gather(dataset, what, data.max_examples, data.read_timeout_s)
    if isinstance(y, dict):
        names = list(y)
        return x, [y[n] for n in names], names, [f"{what} x"] + [f"{what} y[{n!r}]" for n in names]
    return x, [y], [None], [f"{what} x", f"{what} y"]
