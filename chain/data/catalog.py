"""What a data set looks like, known without loading it or TensorFlow: its input shape, its
number of examples and its named targets.

The config checks (`chain.config.checks`) use this to refuse, before TensorFlow starts, a
batch larger than the data, a conv stage on flat input, or a loss that cannot learn a
target. `chain.data.sources` loads the arrays and checks they agree.
"""

from __future__ import annotations

from dataclasses import dataclass

from chain.errors import ConfigError

# scikit-learn's bundled digits: 1797 images of 8x8 pixels, ten classes (fixed by its data file;
# tests/test_data.py checks these against the loaded arrays).
DIGITS_EXAMPLES = 1797
DIGITS_SHAPE = (8, 8, 1)


@dataclass(frozen=True)
class Target:
    """A named target: `classes` > 0 for class labels, 0 for a real value."""

    name: str
    classes: int

    @property
    def is_regression(self) -> bool:
        return self.classes == 0


@dataclass(frozen=True)
class DataInfo:
    """A data set's shape: `input_shape` per example, `examples`, and its `targets` (the first is the default)."""

    name: str
    input_shape: tuple[int, ...]
    examples: int
    targets: tuple[Target, ...]

    def target(self, name: str | None) -> Target:
        """The target called `name` (None: the first), or a ConfigError naming the allowed ones."""
        if name is None:
            return self.targets[0]
        for t in self.targets:
            if t.name == name:
                return t
        raise ConfigError(f"target={name!r} is not a target of data={self.name}; "
                          f"allowed: {', '.join(t.name for t in self.targets)}")


def describe(data) -> DataInfo:
    """The `DataInfo` of a validated `data` section (`chain.config.schema.Data`)."""
    if data.name == "digits":
        return DataInfo("digits", DIGITS_SHAPE, DIGITS_EXAMPLES, (Target("label", 10), Target("parity", 2)))
    return DataInfo("synthetic", (data.features,), data.samples,
                    (Target("label", data.classes), Target("parity", 2), Target("value", 0)))
