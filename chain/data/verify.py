"""Checks of data handed to the chain: one `ValueError` line naming the argument, what was
expected and what was received (whole-batch shapes, never microbatch ones).

`batch(x, y, info, wanted)` checks one batch passed to `Run.step`; `arrays(x, y, info, where)`
checks every data source once when it is loaded, with the same rules, and also that every
input is finite (`finite`). Both accept a value
target as `(N,)` or `(N, 1)` and return it as `(N,)`, so a `(N, 1)` target can never
broadcast against `(N,)` predictions into an `(N, N)` loss; class labels must be integers
(or integral floats) in range and come back as int32.
"""

from __future__ import annotations

from typing import Any, Iterable

import numpy as np

from chain.data.catalog import DataInfo, Target
from chain.errors import ConfigError, first_line


def _array(value: Any, name: str) -> np.ndarray:
    try:
        return np.asarray(value.numpy() if hasattr(value, "numpy") else value)
    except Exception as e:  # ragged lists and the like
        raise ValueError(f"{name} is not an array ({type(value).__name__}: {first_line(e, typed=False)})") from None


def input_dtype(dtype: np.dtype) -> np.dtype:
    """What inputs of `dtype` train as: integers (token ids) stay integers, int32 or, for ids that may not
    fit it (uint32, 64-bit), int64, since float32 holds whole numbers exactly only up to 2^24; anything
    else is float32. A model whose input is float32 casts integers itself (Keras converts a model's
    inputs to its `Input`'s dtype), as before."""
    dtype = np.dtype(dtype)
    if dtype.kind in "iu":
        return np.dtype(np.int64 if dtype.itemsize > 4 or dtype == np.uint32 else np.int32)
    return np.dtype(np.float32)


def inputs(x: Any, info: DataInfo, name: str = "x") -> np.ndarray | dict[str, np.ndarray]:
    """`x` of shape (N, *info.input_shape), N >= 1, as float32 or, for integers, int32/int64 (`input_dtype`);
    a dict of arrays (the inputs of a model with several, as keras_hub's `{"token_ids", "padding_mask"}`)
    as a dict of arrays with N examples each, the same dtypes (booleans kept as they are)."""
    if isinstance(x, dict):
        return structured(x, name)
    a = _array(x, name)
    want = ("N", *info.input_shape)
    if a.dtype.kind not in "fiub":
        raise ValueError(f"{name} has dtype {a.dtype}; expected numbers (float32) of shape {_shape(want)}")
    if a.ndim == 0 or a.shape[0] == 0:
        raise ValueError(
            f"{name} is empty (shape {a.shape}); a batch needs at least one example of shape {tuple(info.input_shape)}"
        )
    if info.lengths_vary:  # length buckets: any length up to the longest
        if a.ndim != 1 + len(info.input_shape) or not 1 <= a.shape[1] <= info.input_shape[0]:
            raise ValueError(
                f"{name} has shape {a.shape}; data={info.name} examples have up to {info.input_shape[0]} ids, so "
                f"expected (N, L) with 1 <= L <= {info.input_shape[0]}"
            )
    elif tuple(a.shape[1:]) != tuple(info.input_shape):
        raise ValueError(
            f"{name} has shape {a.shape}; data={info.name} examples have shape "
            f"{tuple(info.input_shape)}, so expected {_shape(('N', *info.input_shape))}"
        )
    return a.astype(input_dtype(a.dtype), copy=False)


def structured(x: dict, name: str = "x") -> dict[str, np.ndarray]:
    """A dict of input arrays, each numeric with the same number (>= 1) of examples (`inputs`)."""
    out, n = {}, None
    for key, value in x.items():
        a = _array(value, f"{name}[{key!r}]")
        if a.dtype.kind not in "fiub" or a.ndim == 0 or a.shape[0] == 0:
            raise ValueError(
                f"{name}[{key!r}] has dtype {a.dtype} and shape {a.shape}; expected numbers, one row per example"
            )
        if n is not None and a.shape[0] != n:
            raise ValueError(f"{name}[{key!r}] has {a.shape[0]} examples, but {name}'s other inputs have {n}")
        n = a.shape[0]
        out[key] = a if a.dtype.kind == "b" else a.astype(input_dtype(a.dtype), copy=False)
    return out


def finite(x: np.ndarray, name: str) -> np.ndarray:
    """`x` if every input is finite; else one line naming the first example that is not. Checked
    once when data is loaded (a batch passed to `Run.step` may hold NaN: `trainer.on_nan` says
    what a step does with it)."""
    bad = ~np.isfinite(x.reshape(len(x), -1))
    if bad.any():
        i = int(np.flatnonzero(bad.any(1))[0])
        raise ValueError(f"{name} holds {x.reshape(len(x), -1)[i][bad[i]][0]} in example {i}; inputs must be finite")
    return x


def target(y: Any, t: Target, n: int, name: str, length: int | None = None, ignored: int | None = None) -> np.ndarray:
    """One target for `n` examples: shape (n,) or (n, 1), returned as (n,) (a label per position:
    (n, *t.shape), kept; `length`: of examples padded to that length, a length bucket's); labels int32 in
    range, or `ignored` (`ignore_class`: a label the loss leaves out, Hugging Face's -100 too)."""
    a = _array(y, name)
    if t.shape:
        want = (n, *t.shape) if length is None else (n, length, *t.shape[1:])
        if a.shape != want:
            raise ValueError(
                f"{name} has shape {a.shape}; expected {_shape(want)}: one label per "
                f"position of each example of x ({n} examples)"
            )
    elif a.shape not in ((n,), (n, 1)):
        raise ValueError(
            f"{name} has shape {a.shape}; expected ({n},) or ({n}, 1): one "
            f"{'label' if t.classes else 'value'} per example of x ({n} examples)"
        )
    else:
        a = a.reshape(n)
    if a.dtype.kind not in "fiub":
        raise ValueError(
            f"{name} has dtype {a.dtype}; expected {'integer class labels' if t.classes else 'real values'}"
        )
    if t.is_regression:
        if a.dtype.kind == "f" and not np.isfinite(a).all():
            raise ValueError(
                f"{name} holds {a[~np.isfinite(a)][0]} at index {int(np.flatnonzero(~np.isfinite(a))[0])}; "
                "values must be finite"
            )
        return a.astype(np.float32, copy=False)
    flat = a.reshape(-1)  # a label per position: indices name (example, position)
    place = (lambda i: str(i)) if not t.shape else (lambda i: ", ".join(map(str, np.unravel_index(i, a.shape))))
    if a.dtype.kind == "f":
        bad = np.flatnonzero(~np.isfinite(flat) | (flat != np.round(flat)))
        if bad.size:
            raise ValueError(
                f"{name}[{place(bad[0])}] = {flat[bad[0]]!r} is not a class label: target {t.name!r} "
                f"takes integers 0..{t.classes - 1}"
            )
    outside = (flat < 0) | (flat >= t.classes)
    if ignored is not None:
        outside &= flat != ignored
    out_of_range = np.flatnonzero(outside)
    if out_of_range.size:
        i = out_of_range[0]
        raise ValueError(
            f"{name}[{place(i)}] = {flat[i].item()!r} is out of range: target {t.name!r} has "
            f"{t.classes} classes, 0..{t.classes - 1}"
        )
    return a.astype(np.int32)


def batch(
    x: Any, y: Any, info: DataInfo, wanted: Iterable[str], default: str | None, ignored: int | None = None
) -> tuple[np.ndarray, dict]:
    """Check one batch for a chain whose stages learn the targets `wanted` (`ignored`: a label allowed
    besides the classes, `target`).

    `y` is a dict of targets or one bare array, which stands for the target `default`
    (None: the stages learn several targets, so a bare array is refused). Returns
    `(x, {name: y})` with every array checked and normalised.
    """
    wanted = list(wanted)
    x = inputs(x, info)
    n = next(iter(x.values())).shape[0] if isinstance(x, dict) else x.shape[0]
    known = {t.name: t for t in info.targets}
    if not isinstance(y, dict) and default is None:
        raise ValueError(f"the stages learn targets {', '.join(repr(w) for w in wanted)}: pass y as a dict of them")
    ys = dict(y) if isinstance(y, dict) else {default: y}
    for key in ys:
        if key not in known:
            raise ValueError(
                f"y has a target {key!r}, which data={info.name} does not have; its targets: {', '.join(known)}"
            )
    missing = [w for w in wanted if w not in ys]
    if missing:
        raise ValueError(
            f"y has no target {missing[0]!r}, which a stage learns; pass y as a dict with "
            f"{', '.join(repr(w) for w in wanted)}"
        )
    name = (lambda k: f"y[{k!r}]") if isinstance(y, dict) else (lambda k: "y")
    length = x.shape[1] if info.lengths_vary else None
    return x, {k: target(v, known[k], n, name(k), length, ignored) for k, v in ys.items()}


def arrays(
    x: np.ndarray, y: dict[str, np.ndarray], info: DataInfo, where: dict[str, str], ignored: int | None = None
) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """Check a whole data set once, when it is loaded: `(x, targets)` normalised as for a batch (`ignored`:
    a label allowed besides the classes, `target`).

    `where` names what `x` (key "x") and each target were read from (e.g. `data.y='y'`), so
    the ConfigError line names the key.
    """

    try:
        x = finite(inputs(x, info, where["x"]), where["x"])
        return x, {t.name: target(y[t.name], t, len(x), where[t.name], ignored=ignored) for t in info.targets}
    except ValueError as e:
        raise ConfigError(str(e)) from None


def _shape(dims) -> str:
    return "(" + ", ".join(str(d) for d in dims) + ("," if len(dims) == 1 else "") + ")"


def in_vocab(x: np.ndarray, vocab: int, where: str, ignored: int | None = None) -> None:
    """One ConfigError line naming `where` (the key and file) when an id of `x` is outside `[0, vocab)`
    and is not `ignored` (a target's `ignore_class`) (`model.vocab` is a setting: unlike the checks above,
    this one is the config's)."""
    if ignored is not None and not 0 <= ignored < vocab:
        x = x[x != ignored]
    low, top = (int(x.min()), int(x.max())) if x.size else (0, 0)
    if low < 0 or top >= vocab:
        raise ConfigError(
            f"{where} holds the id {low if low < 0 else top}; model.vocab={vocab} takes ids "
            f"0..{vocab - 1}: give model.vocab (and data.classes) the largest id + 1 or more"
        )
