"""The user's `tf.data.Dataset` streamed as it is (`data=callable data.stream=true`,
`function_record.FunctionData`): never gathered into NumPy.

What is known up front comes from the dataset itself: the input shape and the targets from its
element spec, each integer target's number of classes from `data.classes` (a clear line when it is
missing), the number of examples from the dataset's cardinality when TensorFlow knows it, else
from `data.examples`, else from a count (a pass over the dataset, logged; not cached: a function has
no file to key it by). The first `round(examples x data.val_fraction)` examples are the validation
set, the same on every run when the dataset's order is. Training shuffles the rest in a buffer of
`data.shuffle_buffer` from `seed`, repeats it (every example once an epoch), batches and prefetches.

The stream's iterator goes into every checkpoint, so the dataset must be one TensorFlow can save:
one built from tensors and files (`from_tensor_slices`, `TextLineDataset`, `TFRecordDataset`, their
`map`s...). A Python generator (`from_generator`) or `tf.py_function` cannot be saved and is refused
in one line before training.
"""

from __future__ import annotations

import logging

import tensorflow as tf

from chain.data.sources.function import function_read
from chain.data.catalog import DataInfo, Target, held_out, no_other_classes, stream_classes
from chain.data.sources.function.function_record import FunctionData
from chain.data.verify import input_dtype
from chain.errors import ConfigError, first_line
from chain.internals.tf_private import serialize_dataset

log = logging.getLogger("chain")


def _saveable(dataset: tf.data.Dataset, what: str) -> None:
    """Nothing if `dataset`'s state can be saved in a checkpoint; else one line saying what to do."""
    try:  # what a checkpoint of its iterator does first: serialize the dataset's graph, refusing external state
        serialize_dataset(dataset)
    except (tf.errors.OpError, ValueError) as e:
        reason = first_line(e, typed=False).split("Failed to serialize the input pipeline graph: ")[-1]
        reason = reason.split(" [Op:")[0].strip().rstrip(".")
        raise ConfigError(
            f"{what} returned a dataset that cannot be saved in a checkpoint ({reason}: a Python "
            "generator or tf.py_function?); data.stream=true saves the stream's position in every "
            "checkpoint so that a resumed run is exact: build it from tensors or files "
            "(from_tensor_slices, TextLineDataset, TFRecordDataset, their maps), or give "
            "data.stream=false (read whole)"
        ) from None


def _size(dataset: tf.data.Dataset, data, what: str) -> int:
    """The dataset's examples: its cardinality, `data.examples`, or a count (logged)."""
    known = int(dataset.cardinality())
    if known >= 0:
        return known
    if data.examples is not None:
        return data.examples
    log.info("counting the examples of %s (a pass over the dataset; data.examples=N says it instead)", what)
    n = int(dataset.take(data.max_examples + 1).reduce(tf.constant(0, tf.int64), lambda n, _: n + 1))
    if n > data.max_examples:
        raise ConfigError(
            f"{what} gave more than data.max_examples={data.max_examples} examples (an endless "
            "dataset?); return each example once, or raise data.max_examples"
        )
    return n


def plan(data, record: type[FunctionData] = FunctionData) -> FunctionData:
    """What `data=callable data.stream=true` streams (see the module): the function called, its
    dataset checked, described and sized, not read (unless counted); `record`: the class made of it."""
    what = f"data._target_={data._target_}"
    dataset = function_read.function_dataset(data)
    _saveable(dataset, what)
    x_spec, y_spec = dataset.element_spec
    named = isinstance(y_spec, dict)
    specs = list(y_spec.items()) if named else [(None, y_spec)]
    given, targets = dict(data.classes or ()), []
    for name, spec in specs:
        integral = spec.dtype.is_integer or spec.dtype.is_bool
        if spec.shape.num_elements() != 1:
            raise ConfigError(
                f"{what}: its target {name or 'y'} has shape {spec.shape}; a target holds one value per example"
            )
        name = name or ("label" if integral else "value")
        classes = stream_classes(
            given,
            name,
            f"the number of classes of {what}'s target {name} is known only after reading every example",
            needed=integral,
        )
        targets.append(Target(name, classes))
    no_other_classes(given, what, [t.name for t in targets])
    n = _size(dataset, data, what)
    held = held_out(n, data, what)
    if n - held < 1:
        raise ConfigError(f"{what} holds no examples")
    info = DataInfo("callable", tuple(x_spec.shape), n - held, tuple(targets), held)
    return record(dataset, tuple(name for name, _ in specs), info, held, data.shuffle_buffer, what)


def _examples(data: FunctionData) -> tf.data.Dataset:
    """The dataset's examples as (x float32, or integers kept: `chain.data.verify.input_dtype`; {target:
    int32 label or float32 value})."""
    targets = data.info.targets

    def cast(x, y):
        ys = [y[n] for n in data.names] if isinstance(y, dict) else [y]
        kept = tf.as_dtype(input_dtype(x.dtype.as_numpy_dtype)) if x.dtype.is_integer else tf.float32
        return tf.cast(x, kept), {
            t.name: tf.cast(tf.reshape(v, []), tf.int32 if t.classes else tf.float32) for t, v in zip(targets, ys)
        }

    return data.dataset.map(cast, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)


def training(data: FunctionData, batch: int, shuffle: bool, seed: int) -> tf.data.Dataset:
    """The endless stream of `(x, {target: y})` batches of `batch` examples (see the module)."""
    examples = _examples(data).skip(data.held)
    if shuffle:
        examples = examples.shuffle(data.shuffle_buffer, seed=seed, reshuffle_each_iteration=True)
    return examples.repeat().batch(batch, drop_remainder=True).prefetch(tf.data.AUTOTUNE)


def validation(data: FunctionData, batch: int) -> tf.data.Dataset | None:
    """The first `held` examples once, in order, in batches of at most `batch`; None without any."""
    if not data.held:
        return None
    return _examples(data).take(data.held).batch(batch).prefetch(tf.data.AUTOTUNE)
