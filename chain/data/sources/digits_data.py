"""`data=digits`: scikit-learn's 8x8 digits (shipped in its wheel): its settings, description and reader."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from chain.data.catalog import DataInfo, Target, split_info
from chain.data.data_source import DataSet, Read, Source

# scikit-learn's bundled digits: 1797 images of 8x8 pixels, ten classes (fixed by its data file;
# tests/test_data_sources.py checks these against the loaded arrays).
DIGITS_EXAMPLES = 1797
DIGITS_SHAPE = (8, 8, 1)


@dataclass(frozen=True, kw_only=True)
class Digits(DataSet):
    """scikit-learn's 8x8 digits (shipped in its wheel)."""

    KIND: ClassVar[str] = "digits"


def describe(data: Digits) -> DataInfo:
    """Ten classes (`label`) and their parity, of 1797 images."""
    return split_info("digits", DIGITS_SHAPE, DIGITS_EXAMPLES, (Target("label", 10), Target("parity", 2)), data)


def read(data: Digits, seed: int, info: DataInfo | None = None) -> Read:
    """The images scaled to [0, 1] with a channel axis, their labels and the labels' parity."""
    from sklearn.datasets import load_digits

    d = load_digits()
    x = (d.images / 16.0).astype("float32")[..., None]  # (n, 8, 8, 1) in [0, 1]
    label = d.target.astype("int32")
    return Read(x, [label, label % 2], ["label", "parity"], ["data=digits"] * 3)


SOURCE = Source(Digits, describe, read)
