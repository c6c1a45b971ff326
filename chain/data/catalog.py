"""What a data set looks like, known without loading it into TensorFlow: its input shape, its
numbers of training and validation examples, and its named targets.

The config checks (`chain.config.checks`) use this to refuse, before TensorFlow starts, a
batch larger than the data, a conv stage on flat input, a loss that cannot learn a target,
a missing file or a key that is not in it. Each source (`chain.data.sources`, one module each)
describes itself with the helpers here; `chain.data.loader` loads the arrays and checks they
agree. Data that only TensorFlow can read (`tfrecord`, `callable`) is described once loaded
(its `describe` returns None, after checking what it can: its files exist).

Targets: a target is class labels (`classes` > 0) or a real value (0). For the user's data
the kind comes from `data.classes` where given, else from the labels: integers (for CSV,
columns of whole numbers) are classes, their number the largest label + 1; anything else is
a value. A single target given as `data.y` is called `label` (classes) or `value`.

Validation: `val_fraction(data, own)` is the share of the examples held out (`data.val_fraction`;
unset: none when the data set brings its own validation examples, else 0.1), and
`split_size` how many that is; `chain.data.loader.split` draws them.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from chain.errors import ConfigError

DEFAULT_VAL_FRACTION = 0.1


@dataclass(frozen=True)
class Target:
    """A named target: `classes` > 0 for class labels, 0 for a real value. `shape` is one example's
    labels: () for one label, `(seq,)` for one label per position (a language model's next tokens,
    learned by a per-token loss from outputs of shape `(seq, classes)`)."""

    name: str
    classes: int
    shape: tuple[int, ...] = ()

    @property
    def is_regression(self) -> bool:
        return self.classes == 0


@dataclass(frozen=True)
class DataInfo:
    """A data set's shape: `input_shape` per example, `examples` to train on, `val_examples` held
    for validation (0: none), and its `targets` (the first is the default). `lengths_vary`: examples of
    different lengths (length buckets), `input_shape` the longest (what memory must hold); `padded`: targets per
    position padded with id 0, which the loss ignores."""

    name: str
    input_shape: tuple[int, ...]
    examples: int
    targets: tuple[Target, ...]
    val_examples: int = 0
    lengths_vary: bool = False
    padded: bool = False  # its targets per position are padded with id 0 (length buckets, packing)

    @property
    def model_input_shape(self) -> tuple[int | None, ...]:
        """The shape a model's input takes: `input_shape`, its first axis open (None) where lengths vary."""
        return (None, *self.input_shape[1:]) if self.lengths_vary else tuple(self.input_shape)

    def target(self, name: str | None) -> Target:
        """The target called `name` (None: the first), or a ConfigError naming the allowed ones."""
        if name is None:
            return self.targets[0]
        for t in self.targets:
            if t.name == name:
                return t
        raise ConfigError(
            f"target={name!r} is not a target of data={self.name}; allowed: {', '.join(t.name for t in self.targets)}"
        )


# --- validation split ------------------------------------------------------------------------


def own_validation(data) -> str | None:
    """The key of the validation examples a data set brings itself (`data.val_path`, a Keras
    data set's test split), or None."""
    if getattr(data, "val_path", None) is not None:
        return "data.val_path"
    return getattr(data, "OWN_SPLIT", None)  # a data set's own split (`DataSet.OWN_SPLIT`)


def val_fraction(data) -> float:
    """The share of the training examples held out for validation."""
    own = own_validation(data)
    if data.val_fraction is not None and own and own.startswith("data."):
        raise ConfigError(
            f"data.val_fraction={data.val_fraction} and {own} are both set; give one "
            f"(validation comes from {own}, or from a share of the training examples)"
        )
    if data.val_fraction is not None:
        return data.val_fraction
    return 0.0 if own else DEFAULT_VAL_FRACTION


def split_size(n: int, fraction: float) -> int:
    """How many of `n` examples `fraction` holds out: round(n x fraction), at least 1 and at
    most n - 1 (none for a fraction of 0)."""
    if fraction <= 0 or n < 2:
        return 0
    return min(n - 1, max(1, round(n * fraction)))


def held_out(n: int, data, what: str) -> int:
    """`split_size` of `n` examples (`what` says which) for `val_fraction(data)`; one line when a
    fraction above 0 holds none out of a single example, rather than a run with no validation."""
    fraction = val_fraction(data)
    held = split_size(n, fraction)
    if fraction > 0 and n == 1:
        default = "" if data.val_fraction is not None else " (the default)"
        raise ConfigError(
            f"data.val_fraction={fraction:g}{default} holds out none of the 1 example of {what}: "
            "validation and training need one each; give more examples, or data.val_fraction=0 "
            "(no validation)"
        )
    return held


def split_info(name: str, shape: tuple[int, ...], n: int, targets: tuple[Target, ...], data, own: int = 0) -> DataInfo:
    """The `DataInfo` of `n` examples of which `val_fraction(data)` is held out for validation;
    `own`: validation examples the data set brings besides (`data.val_path`)."""
    held = held_out(n, data, f"data={name}")
    return DataInfo(name, shape, n - held, targets, held + own)


# --- the user's targets ----------------------------------------------------------------------


def target_keys(data) -> list[tuple[str | None, str, str]]:
    """What the user's targets are read from: (name, array key or column, config key); the
    name is None for `data.y`, whose name comes from its kind (`name_targets`)."""
    if data.y is not None and data.targets is not None:
        raise ConfigError(
            "data.y and data.targets are both set; give one (data.targets={name: KEY, ...} for several targets)"
        )
    if data.targets:
        return [(name, key, f"data.targets.{name}") for name, key in data.targets]
    if data.y is not None:
        return [(None, data.y, "data.y")]
    raise ConfigError(f"data={data.name} needs its target: data.y=KEY, or data.targets={{name: KEY, ...}} for several")


def _integral(a: np.ndarray, by_values: bool) -> bool:
    if a.dtype.kind in "iub":
        return True
    return by_values and a.dtype.kind == "f" and bool(np.all(np.isfinite(a) & (a == np.round(a))))


def name_targets(data, labels: list[tuple[str | None, np.ndarray, str]], by_values: bool = False) -> tuple[Target, ...]:
    """The targets of `labels` ((name or None, every label array of that target, training and
    validation together, what it was read from)): kinds from `data.classes`, else from the values
    (integers: classes, max + 1; `by_values`: also whole-number reals, for untyped sources such
    as CSV). Integers that are all negative fit neither kind without being told: refused."""
    given = dict(data.classes or ())
    targets = []
    for name, a, where in labels:
        integral = _integral(a, by_values)
        name = name or ("label" if integral else "value")
        classes = given.pop(name, None)
        if classes is None and integral and a.size and a.max() < 0:
            raise ConfigError(
                f"{where} holds integer labels that are all negative ({a.min():g}..{a.max():g}): class "
                f"labels are 0..C-1; data.classes={{{name}: 0}} learns them as a real value"
            )
        if classes is None:
            classes = max(2, int(a.max()) + 1) if integral and a.size and a.max() >= 0 else 0
        elif classes == 1:
            raise ConfigError(f"data.classes.{name}=1: a class target needs at least 2 classes (0: a real value)")
        targets.append(Target(name, classes, _label_shape(a, classes, where)))
    if given:
        raise ConfigError(
            f"data.classes names {next(iter(given))!r}, which is not a target of data={data.name}; "
            f"its targets: {', '.join(t.name for t in targets)}"
        )
    return tuple(targets)


def label_shape(shape: tuple[int, ...]) -> tuple[int, ...]:
    """A target's `Target.shape` from one example's labels' shape: () for one label (() or (1,)), else as is."""
    return () if tuple(shape) in ((), (1,)) else tuple(shape)


def _label_shape(a: np.ndarray, classes: int, where: str) -> tuple[int, ...]:
    """One example's labels in `a` (every example's, first axis): () for one label ((N,) or (N, 1)),
    `(seq,)` for a class label per position ((N, seq)); a value per position is not learned."""
    shape = label_shape(a.shape[1:])
    if shape and (len(shape) != 1 or not classes):
        raise ConfigError(
            f"{where} has shape {tuple(a.shape)}; a target is one label or value per example "
            "((N,) or (N, 1)), or one class label per position ((N, seq): integers)"
        )
    return shape


def input_shape(shape: tuple[int, ...], key: str) -> tuple[int, ...]:
    """One example's shape from an input array's shape (N, ...); one line if there is no example axis."""
    if len(shape) < 2:
        raise ConfigError(f"{key} has shape {tuple(shape)}; expected one example per row, (N, features...)")
    return tuple(shape[1:])


def stream_classes(given: dict, name: str, known_after: str, *, needed: bool) -> int:
    """A streamed target's number of classes from `data.classes` (`given`, name -> classes, from which
    `name` is taken), 0 for a value. A stream cannot count the classes without a pass over the data:
    one line naming the key when `needed` and missing (`known_after`: what would have to be read)."""
    classes = given.pop(name, None)
    if classes is None and needed:
        raise ConfigError(
            f"data.classes.{name} is needed with data.stream=true: {known_after}; e.g. "
            f"data.classes={{{name}: 10}} (0: learn it as a real value)"
        )
    if classes == 1:
        raise ConfigError(f"data.classes.{name}=1: a class target needs at least 2 classes (0: a real value)")
    return classes or 0


def no_other_classes(given: dict, source: str, targets: list[str]) -> None:
    """One line when `data.classes` (what `stream_classes` left of it) names a target `source` does not have."""
    if given:
        raise ConfigError(
            f"data.classes names {next(iter(given))!r}, which is not a target of {source}; "
            f"its targets: {', '.join(targets)}"
        )


def increasing_buckets(buckets: tuple[int, ...]) -> None:
    """`data.buckets` (lengths of examples of different lengths) increasing; one line naming the key otherwise."""
    if any(b >= c for b, c in zip(buckets, buckets[1:])):
        shown = ",".join(map(str, buckets))
        raise ConfigError(f"data.buckets=[{shown}] must be increasing, e.g. data.buckets=[64,128,256]")
