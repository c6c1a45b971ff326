"""`data=synthetic`: Gaussian inputs labelled by a fixed random teacher network: its settings,
description and reader."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from chain.data.catalog import DataInfo, Target, split_info
from chain.data.data_source import DataSet, Read, Source
from chain.fields import integer, setting

MAX_SAMPLES = 1 << 24


@dataclass(frozen=True, kw_only=True)
class Synthetic(DataSet):
    """Gaussian inputs labelled by a fixed random teacher network."""

    KIND: ClassVar[str] = "synthetic"
    samples: int = setting(integer(1, MAX_SAMPLES), "number of examples")
    features: int = setting(integer(1, 65536), "inputs per example")
    classes: int = setting(integer(2, 65536), "number of classes of the `label` target")


def describe(data: Synthetic) -> DataInfo:
    """`label` (the teacher's class), its parity, and `value` (a real-valued margin)."""
    targets = (Target("label", data.classes), Target("parity", 2), Target("value", 0))
    return split_info("synthetic", (data.features,), data.samples, targets, data)


def read(data: Synthetic, seed: int, info: DataInfo | None = None) -> Read:
    """The examples drawn from `seed`."""
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


SOURCE = Source(Synthetic, describe, read)
