"""A finite `tf.data.Dataset` read whole into NumPy arrays, bounded (`gather`): how the sources only
TensorFlow can read are read once, at build time (TFRecord files: `tfrecord_read`; the user's
function returning a `tf.data.Dataset`: `function_read`, both in their folders of `chain.data.sources`).

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

from chain.errors import ConfigError, first_line

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


def gather(dataset: tf.data.Dataset, what: str, max_examples: int | None = None, timeout_s: float | None = None) -> Any:
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
