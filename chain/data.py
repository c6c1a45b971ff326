"""Data sets: arrays in memory, one `tf.data` pipeline shared by all stages.

A data set has inputs `x` and one or more named targets; a stage in `mode=local`
learns the target it names (the first one by default).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np


@dataclass(frozen=True)
class Target:
    """A named target: `classes` > 0 for class labels, 0 for a real value."""

    name: str
    classes: int

    @property
    def is_regression(self) -> bool:
        return self.classes == 0


@dataclass
class Dataset:
    """Arrays of one data set; `targets` describes `y`, in order (the first is the default)."""

    name: str
    x: np.ndarray
    y: dict[str, np.ndarray]
    targets: tuple[Target, ...]

    @property
    def input_shape(self) -> tuple[int, ...]:
        return tuple(self.x.shape[1:])

    def target(self, name: str | None) -> Target:
        from chain.errors import ConfigError

        if name is None:
            return self.targets[0]
        for t in self.targets:
            if t.name == name:
                return t
        raise ConfigError(f"target={name!r} is not a target of data={self.name}; allowed: {', '.join(t.name for t in self.targets)}")


def _digits() -> Dataset:
    from sklearn.datasets import load_digits

    d = load_digits()
    x = (d.images / 16.0).astype("float32")[..., None]  # (n, 8, 8, 1) in [0, 1]
    label = d.target.astype("int32")
    return Dataset("digits", x, {"label": label, "parity": label % 2},
                   (Target("label", 10), Target("parity", 2)))


def _synthetic(cfg: dict[str, Any], seed: int) -> Dataset:
    # A fixed random two-layer teacher labels Gaussian inputs: learnable, and the
    # same for the same seed on every machine.
    rng = np.random.default_rng(seed)
    n, f, c = cfg["samples"], cfg["features"], cfg["classes"]
    x = rng.standard_normal((n, f)).astype("float32")
    w1 = rng.standard_normal((f, 2 * f)) / np.sqrt(f)
    w2 = rng.standard_normal((2 * f, c)) / np.sqrt(2 * f)
    logits = np.tanh(x @ w1) @ w2
    label = logits.argmax(1).astype("int32")
    value = (logits[:, 0] - logits[:, 1:].mean(1)).astype("float32")
    return Dataset("synthetic", x, {"label": label, "parity": label % 2, "value": value},
                   (Target("label", c), Target("parity", 2), Target("value", 0)))


def load(cfg: dict[str, Any], seed: int) -> Dataset:
    """Load the data set named by the validated `data` section."""
    if cfg["name"] == "digits":
        return _digits()
    return _synthetic(cfg, seed)


def training_batches(ds: Dataset, settings: dict[str, Any]):
    """The run's endless, shared `tf.data` stream of `(x, {target: y})` batches: one per
    optimizer step, of `trainer.grad_accum` x `data.batch_size` examples, shuffled with
    `seed` (validated `settings`).

    Batching a shuffled, repeated stream, a batch of N x B examples holds the same
    examples, in the same order, as N consecutive batches of B.
    """
    import tensorflow as tf

    from chain.errors import ConfigError

    d, n = settings["data"], settings["trainer"]["grad_accum"]
    per_step = n * d["batch_size"]
    if per_step > len(ds.x):
        if n == 1:
            raise ConfigError(f"data.batch_size={per_step} is larger than data={ds.name} ({len(ds.x)} examples)")
        raise ConfigError(f"trainer.grad_accum={n} x data.batch_size={d['batch_size']} = {per_step} examples "
                          f"per step is more than data={ds.name} has ({len(ds.x)})")
    data = tf.data.Dataset.from_tensor_slices((ds.x, ds.y))
    if d["shuffle"]:
        data = data.shuffle(len(ds.x), seed=settings["seed"], reshuffle_each_iteration=True)
    return data.repeat().batch(per_step, drop_remainder=True).prefetch(tf.data.AUTOTUNE)
