"""Data sources: the arrays of a data set in memory, split into training and validation
examples, described by `chain.data.catalog`.

Every source is read into NumPy arrays once, at build time: the built-in data sets, the
user's `.npz` and CSV files and the Keras cache with NumPy (`chain.data.files`), TFRecord
files and the user's `tf.data.Dataset` with TensorFlow (`chain.data.tensors`). Then every
source goes the same way: validation examples held out (`split`, seeded), every array
checked once against the data set's description with the rules `Run.step` applies to a
batch (`chain.data.verify.arrays`), and one input stream (`chain.data.stream`).

A data set has inputs `x` and one or more named targets; a stage in `mode=local` learns
the target it names (the first one by default).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from chain.data import files
from chain.data.catalog import (DataInfo, Target, csv_columns, describe, input_shape, name_targets, split_info,
                                target_keys)
from chain.data.verify import arrays
from chain.errors import ConfigError

SPLIT_STREAM = 0x5EED  # the split's random stream, apart from the one `synthetic` draws its data from


@dataclass
class Dataset:
    """Arrays of one data set; `info` describes them (`info.targets` in the order of `y`).

    `x`, `y` are the training examples, `val_x`, `val_y` the validation examples (None when
    the data set has none: `data.val_fraction=0`)."""

    info: DataInfo
    x: np.ndarray
    y: dict[str, np.ndarray]
    val_x: np.ndarray | None = None
    val_y: dict[str, np.ndarray] | None = None

    @property
    def name(self) -> str:
        return self.info.name

    @property
    def input_shape(self) -> tuple[int, ...]:
        return tuple(self.x.shape[1:])

    @property
    def targets(self) -> tuple[Target, ...]:
        return self.info.targets

    def target(self, name: str | None) -> Target:
        """The target called `name` (None: the first); a ConfigError names the allowed ones."""
        return self.info.target(name)


@dataclass
class Read:
    """What a source read: inputs and targets (in the data set's target order; `names[k]` None
    for `data.y`, named by its kind), the validation examples it brings (None: held out by
    `split`), and what each array was read from (`where`, for error lines)."""

    x: np.ndarray
    ys: list[np.ndarray]
    names: list[str | None]
    where: list[str]
    val: tuple[np.ndarray, list[np.ndarray]] | None = None
    val_where: list[str] = field(default_factory=list)


def split(n: int, held: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Indices of the training and of the `held` validation examples among `n`: a random choice
    drawn from `seed` (the same on every run with this seed), each in the data's order."""
    order = np.random.default_rng([seed, SPLIT_STREAM]).permutation(n)
    return np.sort(order[held:]), np.sort(order[:held])


# --- the sources -----------------------------------------------------------------------------


def _digits(data, seed: int) -> Read:
    from sklearn.datasets import load_digits

    d = load_digits()
    x = (d.images / 16.0).astype("float32")[..., None]  # (n, 8, 8, 1) in [0, 1]
    label = d.target.astype("int32")
    return Read(x, [label, label % 2], ["label", "parity"], ["data=digits"] * 3)


def _synthetic(data, seed: int) -> Read:
    # A fixed random two-layer teacher labels Gaussian inputs: learnable, and the
    # same for the same seed on every machine.
    rng = np.random.default_rng(seed)
    n, f, c = data.samples, data.features, data.classes
    x = rng.standard_normal((n, f)).astype("float32")
    w1 = rng.standard_normal((f, 2 * f)) / np.sqrt(f)
    w2 = rng.standard_normal((2 * f, c)) / np.sqrt(2 * f)
    logits = np.tanh(x @ w1) @ w2
    label = logits.argmax(1).astype("int32")
    value = (logits[:, 0] - logits[:, 1:].mean(1)).astype("float32")
    return Read(x, [label, label % 2, value], ["label", "parity", "value"], ["data=synthetic"] * 4)


def _keras(data, seed: int) -> Read:
    x, y, x_test, y_test = files.keras_arrays(data.name)
    where = [f"data.name={data.name} (the Keras cache)"] * 2
    val = (x_test, [y_test]) if data.val_fraction is None else None
    return Read(x, [y], ["label"], where, val, where)


def _from_files(data, read, key: str, val_key: str) -> Read:
    """A source of files: `read(path, key) -> (x, targets, where)` reads `data.<key>` and, when
    given, the validation examples of `data.<val_key>`."""
    x, ys, where = read(getattr(data, key), f"data.{key}")
    names = [name for name, _, _ in target_keys(data)]
    if getattr(data, val_key) is None:
        return Read(x, ys, names, where)
    vx, vys, val_where = read(getattr(data, val_key), f"data.{val_key}")
    return Read(x, ys, names, where, (vx, vys), [f"{w} of data.{val_key}" for w in val_where])


def _npz(data, seed: int) -> Read:
    def read(path: str, path_key: str) -> tuple[np.ndarray, list[np.ndarray], list[str]]:
        keys = target_keys(data)
        ys = [files.npz_array(path, key, where, path_key) for _, key, where in keys]
        x = files.npz_array(path, data.x, "data.x", path_key)
        return x, ys, [f"data.x={data.x!r} of {path}"] + [f"{w}={k!r}" for _, k, w in keys]

    return _from_files(data, read, "path", "val_path")


def _csv(data, seed: int) -> Read:
    def read(path: str, path_key: str) -> tuple[np.ndarray, list[np.ndarray], list[str]]:
        table = files.csv_table(path, path_key)
        x = np.stack([table.column(c, "data.x") for c in csv_columns(data, table)], 1).astype(np.float32)
        keys = target_keys(data)
        where = [f"the input columns of {path}"] + [f"{w}={k!r}" for _, k, w in keys]
        return x, [table.column(k, w) for _, k, w in keys], where

    return _from_files(data, read, "path", "val_path")


def _tfrecord(data, seed: int) -> Read:
    from chain.data import tensors

    return _from_files(data, lambda path, key: tensors.records(data, path, key), "files", "val_files")


def _callable(data, seed: int) -> Read:
    from chain.data import tensors

    return Read(*tensors.call(data))


READERS = {"digits": _digits, "synthetic": _synthetic, "npz": _npz, "csv": _csv, "tfrecord": _tfrecord,
           "callable": _callable, **{name: _keras for name in files.KERAS}}


def _describe_read(data, read: Read) -> DataInfo:
    """The `DataInfo` of data only TensorFlow could read, from its arrays."""
    labels = [(name, np.concatenate([y.reshape(-1)] + ([read.val[1][k].reshape(-1)] if read.val else [])),
               read.where[k + 1]) for k, (name, y) in enumerate(zip(read.names, read.ys))]
    targets = name_targets(data, labels)
    shape = input_shape(read.x.shape, read.where[0])
    return split_info(data.name, shape, len(read.x), targets, data, own=len(read.val[0]) if read.val else 0)


def load(data, seed: int) -> Dataset:
    """Load the data set named by a validated `data` section (`chain.config.schema.Data`): its
    training and validation examples, each array checked (one ConfigError line naming the key)."""
    read = READERS[data.name](data, seed)
    info = describe(data) or _describe_read(data, read)
    names = [t.name for t in info.targets]
    # Checked as read, so that an error names the example's place in its file.
    x, y = arrays(read.x, dict(zip(names, read.ys)), info, dict(zip(["x", *names], read.where)))
    val = None
    if read.val is not None:
        val = arrays(read.val[0], dict(zip(names, read.val[1])), info, dict(zip(["x", *names], read.val_where)))
    elif info.val_examples:
        train, held = split(len(x), info.val_examples, seed)
        x, y, val = x[train], {k: v[train] for k, v in y.items()}, (x[held], {k: v[held] for k, v in y.items()})
    if len(x) != info.examples or (len(val[0]) if val else 0) != info.val_examples:
        # the catalog must tell the truth
        raise ConfigError(f"data={info.name} holds {len(x)} training and {len(val[0]) if val else 0} validation "
                          f"examples, but its description says {info.examples} and {info.val_examples}")
    return Dataset(info, x, y, *(val or (None, None)))
