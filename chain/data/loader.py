"""Loading a data set: its arrays in memory, split into training and validation examples.

Every source (`chain.data.sources`: a module or a folder each) is read into NumPy arrays once, at
build time, given the description the preparation pass made of it (`chain.prepared`): the built-in
data sets, the user's `.npz` and CSV files and the Keras cache with NumPy (each by its own source),
TFRecord files and the user's `tf.data.Dataset` with TensorFlow (`chain.data.tensors`). Then
every source goes the same way: validation examples held out (`split`, seeded), every array
checked once against the data set's description with the rules `Run.step` applies to a
batch (`chain.data.verify.arrays`), and one input stream (`chain.data.stream`).

With `data.stream=true` nothing is loaded: the `Dataset` holds what to stream (its source's record,
a `chain.data.streamed.Streamed`), which opens its stream while training (`chain.data.stream`).

A data set has inputs `x` and one or more named targets; a stage in `mode=local` learns
the target it names (the first one by default).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from chain.data import sources
from chain.data.catalog import DataInfo, Target, input_shape, label_shape, name_targets, split_info
from chain.data.data_source import Read
from chain.data.streamed import Streamed
from chain.data.verify import arrays
from chain.errors import ConfigError

SPLIT_STREAM = 0x5EED  # the split's random stream, apart from the one `synthetic` draws its data from


@dataclass
class Dataset:
    """Arrays of one data set; `info` describes them (`info.targets` in the order of `y`).

    `x`, `y` are the training examples, `val_x`, `val_y` the validation examples (None when
    the data set has none: `data.val_fraction=0`). A streamed data set (`data.stream=true`) has
    no arrays (`x` None, `y` empty): `shards` says what holds its examples."""

    info: DataInfo
    x: np.ndarray | None
    y: dict[str, np.ndarray]
    val_x: np.ndarray | None = None
    val_y: dict[str, np.ndarray] | None = None
    shards: Streamed | None = None
    skipped: Any = None  # a stream's count of bad records left out (a tf.Variable; data.on_bad_record=skip)

    @property
    def skipped_records(self) -> int:
        """Bad records this process left out of its stream (`data.on_bad_record=skip`); 0 for loaded data."""
        return int(self.skipped.numpy()) if self.skipped is not None else 0

    @property
    def name(self) -> str:
        return self.info.name

    @property
    def input_shape(self) -> tuple[int, ...]:
        return tuple(self.info.input_shape)

    @property
    def targets(self) -> tuple[Target, ...]:
        return self.info.targets

    def target(self, name: str | None) -> Target:
        """The target called `name` (None: the first); a ConfigError names the allowed ones."""
        return self.info.target(name)


def split(n: int, held: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Indices of the training and of the `held` validation examples among `n`: a random choice
    drawn from `seed` (the same on every run with this seed), each in the data's order."""
    order = np.random.default_rng([seed, SPLIT_STREAM]).permutation(n)
    return np.sort(order[held:]), np.sort(order[:held])


def _describe_read(data, read: Read) -> DataInfo:
    """The `DataInfo` of data only TensorFlow could read, from its arrays."""

    def rows(y: np.ndarray) -> np.ndarray:  # a label per position ((N, seq)) keeps its shape: the target's
        return y.reshape(len(y), *label_shape(y.shape[1:]))

    labels = [
        (name, np.concatenate([rows(y)] + ([rows(read.val[1][k])] if read.val else [])), read.where[k + 1])
        for k, (name, y) in enumerate(zip(read.names, read.ys))
    ]
    targets = name_targets(data, labels)
    shape = input_shape(read.x.shape, read.where[0])
    return split_info(data.name, shape, len(read.x), targets, data, own=len(read.val[0]) if read.val else 0)


_UNSET = object()


def load(data, seed: int, info: DataInfo | None = _UNSET, ignore_class: int | None = None) -> Dataset:
    """Load the data set named by a validated `data` section (one of `chain.data.sources`): its
    training and validation examples, each array checked (one ConfigError line naming the key; a label
    may also be `ignore_class`, which the loss leaves out).

    `info` is the data set's description (`chain.data.sources.describe`, made once by the
    preparation pass; None for data only TensorFlow reads, described here from its arrays);
    left out, it is described here first."""
    if info is _UNSET:
        info = sources.describe(data)
    if getattr(data, "stream", False):  # described up front (counted), read while training
        plan = sources.SOURCES[data.name].shards(data)
        return Dataset(info if info is not None else plan.info, None, {}, shards=plan)  # the user's dataset: its own
    read = sources.read(data, seed, info)
    info = info or _describe_read(data, read)
    names = [t.name for t in info.targets]
    # Checked as read, so that an error names the example's place in its file.
    x, y = arrays(read.x, dict(zip(names, read.ys)), info, dict(zip(["x", *names], read.where)), ignore_class)
    val = None
    if read.val is not None:
        where = dict(zip(["x", *names], read.val_where))
        val = arrays(read.val[0], dict(zip(names, read.val[1])), info, where, ignore_class)
    elif info.val_examples:
        train, held = split(len(x), info.val_examples, seed)
        x, y, val = x[train], {k: v[train] for k, v in y.items()}, (x[held], {k: v[held] for k, v in y.items()})
    if len(x) != info.examples or (len(val[0]) if val else 0) != info.val_examples:
        # the catalog must tell the truth
        raise ConfigError(
            f"data={info.name} holds {len(x)} training and {len(val[0]) if val else 0} validation "
            f"examples, but its description says {info.examples} and {info.val_examples}"
        )
    return Dataset(info, x, y, *(val or (None, None)))
