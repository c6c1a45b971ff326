"""The Keras data sets read from Keras' own cache files with NumPy alone (no TensorFlow):
`keras_home`, `keras_files`, `keras_arrays`, `KERAS` (each set's files, sizes and reader). A set
missing from the cache is one line that says how to fill it, never a download."""

from __future__ import annotations

import gzip
import os
import pickle
from dataclasses import dataclass
from typing import Callable

import numpy as np

from chain.errors import ConfigError, first_line


def keras_home() -> str:
    """Keras' cache directory as Keras chooses it: `KERAS_HOME`, else `~/.keras` (`/tmp/.keras`
    when the home directory is not writable)."""
    if "KERAS_HOME" in os.environ:
        return os.environ["KERAS_HOME"]
    home = os.path.expanduser("~")
    return os.path.join(home if os.access(home, os.W_OK) else "/tmp", ".keras")


def _idx(path: str, offset: int) -> np.ndarray:
    with gzip.open(path, "rb") as f:
        return np.frombuffer(f.read(), np.uint8, offset=offset)


class _Arrays(pickle.Unpickler):
    """Unpickles NumPy arrays, lists and dicts only (CIFAR's batch files), nothing that runs code."""

    ALLOWED = {
        ("numpy", "ndarray"),
        ("numpy", "dtype"),
        ("numpy.core.multiarray", "_reconstruct"),
        ("numpy._core.multiarray", "_reconstruct"),
    }

    def find_class(self, module: str, name: str):
        if (module, name) not in self.ALLOWED:
            raise pickle.UnpicklingError(f"{module}.{name} is not allowed in a CIFAR batch file")
        return super().find_class(module, name)


def _cifar_batch(path: str) -> tuple[np.ndarray, np.ndarray]:
    with open(path, "rb") as f:
        d = _Arrays(f, encoding="bytes").load()
    x = np.asarray(d[b"data"], np.uint8).reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1)
    return x, np.asarray(d[b"labels"], np.int64)


def _read_mnist(files: list[str]) -> tuple:
    with np.load(files[0], allow_pickle=False) as f:
        return f["x_train"], f["y_train"], f["x_test"], f["y_test"]


def _read_fashion(files: list[str]) -> tuple:
    y_train, x_train, y_test, x_test = (_idx(p, 8 if "labels" in p else 16) for p in files)
    return x_train.reshape(len(y_train), 28, 28), y_train, x_test.reshape(len(y_test), 28, 28), y_test


def _read_cifar(files: list[str]) -> tuple:
    train = [_cifar_batch(p) for p in files[:-1]]
    x_test, y_test = _cifar_batch(files[-1])
    return np.concatenate([x for x, _ in train]), np.concatenate([y for _, y in train]), x_test, y_test


@dataclass(frozen=True)
class KerasSet:
    """One Keras data set: its cache files (under `KERAS_HOME/datasets`; the first folder of
    `folders` that holds them all), its shapes and sizes (fixed: tests/test_data_sources.py reads
    small stand-ins through the same code), and its reader."""

    folders: tuple[str, ...]
    files: tuple[str, ...]
    input_shape: tuple[int, ...]
    train: int
    test: int
    classes: int
    read: Callable[[list[str]], tuple]


_CIFAR = tuple(f"data_batch_{i}" for i in range(1, 6)) + ("test_batch",)
KERAS = {
    "mnist": KerasSet(("",), ("mnist.npz",), (28, 28, 1), 60000, 10000, 10, _read_mnist),
    "fashion_mnist": KerasSet(
        ("fashion-mnist",),
        (
            "train-labels-idx1-ubyte.gz",
            "train-images-idx3-ubyte.gz",
            "t10k-labels-idx1-ubyte.gz",
            "t10k-images-idx3-ubyte.gz",
        ),
        (28, 28, 1),
        60000,
        10000,
        10,
        _read_fashion,
    ),
    # Keras 3 extracts CIFAR into cifar-10-batches-py-target/; Keras 2 used cifar-10-batches-py/.
    "cifar10": KerasSet(
        ("cifar-10-batches-py-target/cifar-10-batches-py", "cifar-10-batches-py"),
        _CIFAR,
        (32, 32, 3),
        50000,
        10000,
        10,
        _read_cifar,
    ),
}


def keras_files(name: str) -> list[str]:
    """The cache files of Keras data set `name`; a ConfigError (no download) if any is missing."""
    spec = KERAS[name]
    root = os.path.join(keras_home(), "datasets")
    for folder in spec.folders:
        paths = [os.path.join(root, folder, f) for f in spec.files]
        if all(os.path.isfile(p) for p in paths):
            return paths
    first = os.path.join(root, spec.folders[0])
    missing = next(p for p in (os.path.join(first, f) for f in spec.files) if not os.path.isfile(p))
    raise ConfigError(
        f"data=keras data.name={name} reads the local Keras cache, but {missing} is missing (chain never downloads); "
        f"fill it on a machine with internet (python -c 'import keras; keras.datasets.{name}.load_data()') and copy "
        f"what that writes under ~/.keras/datasets/ into {root}, or set KERAS_HOME to a directory whose datasets/ "
        "holds it"
    )


def keras_arrays(name: str) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """`(x_train, y_train, x_test, y_test)` of Keras data set `name`: inputs float32 in [0, 1]
    with a channel axis, labels as read."""
    spec = KERAS[name]

    def scaled(x: np.ndarray) -> np.ndarray:
        return (x.astype(np.float32) / 255.0).reshape(len(x), *spec.input_shape)

    files = keras_files(name)
    try:
        x_train, y_train, x_test, y_test = spec.read(files)
        return scaled(x_train), np.asarray(y_train).reshape(-1), scaled(x_test), np.asarray(y_test).reshape(-1)
    except (OSError, ValueError, KeyError, EOFError, pickle.UnpicklingError) as e:
        raise ConfigError(
            f"data=keras data.name={name}: the cache files in {os.path.dirname(files[0])} cannot be "
            f"read ({first_line(e)}); fill the cache "
            "again"
        ) from None
