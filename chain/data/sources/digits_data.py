"""`data=digits`: the 8x8 handwritten digits, shipped inside this package: settings, description, reader.

The file `digits.npz` is the copy scikit-learn ships (`sklearn.datasets.load_digits`): the test set of
the UCI "Optical Recognition of Handwritten Digits" data (E. Alpaydin, C. Kaynak, 1998; CC BY 4.0),
1797 images of 8x8 pixels with counts 0..16, as uint8, and their labels. It is shipped here rather
than read from scikit-learn because Keras imports scikit-learn (and SciPy) whenever it is installed,
which cost every process 1.4 s of CPU at start.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from chain.data.catalog import DataInfo, Target, split_info
from chain.data.data_source import DataSet, Read, Source

# 1797 images of 8x8 pixels, ten classes (fixed by the data file; tests/test_data_sources.py checks
# these against the loaded arrays).
DIGITS_EXAMPLES = 1797
DIGITS_SHAPE = (8, 8, 1)


@dataclass(frozen=True, kw_only=True)
class Digits(DataSet):
    """The 8x8 handwritten digits (UCI, as scikit-learn ships them), shipped inside chain."""

    KIND: ClassVar[str] = "digits"


def describe(data: Digits) -> DataInfo:
    """Ten classes (`label`) and their parity, of 1797 images."""
    return split_info("digits", DIGITS_SHAPE, DIGITS_EXAMPLES, (Target("label", 10), Target("parity", 2)), data)


def read(data: Digits, seed: int, info: DataInfo | None = None) -> Read:
    """The images scaled to [0, 1] with a channel axis, their labels and the labels' parity."""
    with np.load(os.path.join(os.path.dirname(__file__), "digits.npz")) as d:
        images, target = d["images"], d["target"]
    x = (images / 16.0).astype("float32")[..., None]  # (n, 8, 8, 1) in [0, 1]
    label = target.astype("int32")
    return Read(x, [label, label % 2], ["label", "parity"], ["data=digits"] * 3)


SOURCE = Source(Digits, describe, read)
