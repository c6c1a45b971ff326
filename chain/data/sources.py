"""Data sources: the arrays of a data set in memory, described by `chain.data.catalog`.

A data set has inputs `x` and one or more named targets; a stage in `mode=local`
learns the target it names (the first one by default).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from chain.data.catalog import DataInfo, Target, describe
from chain.data.checks import arrays
from chain.errors import ConfigError


@dataclass
class Dataset:
    """Arrays of one data set; `info` describes them (`info.targets` in the order of `y`)."""

    info: DataInfo
    x: np.ndarray
    y: dict[str, np.ndarray]

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


def _digits() -> tuple[np.ndarray, dict[str, np.ndarray]]:
    from sklearn.datasets import load_digits

    d = load_digits()
    x = (d.images / 16.0).astype("float32")[..., None]  # (n, 8, 8, 1) in [0, 1]
    label = d.target.astype("int32")
    return x, {"label": label, "parity": label % 2}


def _synthetic(data, seed: int) -> tuple[np.ndarray, dict[str, np.ndarray]]:
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
    return x, {"label": label, "parity": label % 2, "value": value}


def load(data, seed: int) -> Dataset:
    """Load the data set named by a validated `data` section (`chain.config.schema.Data`)."""
    x, y = _digits() if data.name == "digits" else _synthetic(data, seed)
    info = describe(data)
    if x.shape != (info.examples, *info.input_shape):  # the catalog must tell the truth
        raise ConfigError(f"data={info.name} holds {x.shape[0]} examples of shape {x.shape[1:]}, but its catalog "
                          f"entry says {info.examples} of shape {info.input_shape}")
    return Dataset(info, x.astype(np.float32, copy=False), arrays(x, y, info, f"data={info.name}"))
