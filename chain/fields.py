"""Checked settings fields: `setting(check, help)` declares a dataclass field of a config section,
and the checks for single config values: each takes `(key, value)` and returns the value
(normalised: lists become tuples, numbers floats) or raises a one-line `ConfigError`
that names the key and says what is allowed.

A leaf (it imports only `chain.errors`): the config's schema (`chain.config.schema`) and each data
source's settings (`chain.data.sources`) declare their keys with it.

Every check is O(1) in the value it is given (a list: O(its length)): validation never
loops over a configured number.
"""

from __future__ import annotations

import math
from dataclasses import field
from typing import Any, Callable

from chain.errors import ConfigError, closest

Check = Callable[[str, Any], Any]


def setting(check: Check, help: str = "") -> Any:
    """A dataclass field validated by `check` (one of the checks below); `help` is its one line of
    meaning in the config reference (`docs/config.md`, written by `scripts/config_reference.py`)."""
    return field(metadata={"check": check, "help": help})


def is_int(v: Any) -> bool:
    """A Python int that is not a bool (YAML's `true` is an int to Python)."""
    return isinstance(v, int) and not isinstance(v, bool)


def integer(minimum: int | None = None, maximum: int | None = None) -> Check:
    """An integer within [minimum, maximum] (either bound optional)."""

    def check(key: str, v: Any) -> int:
        if not is_int(v):
            raise ConfigError(f"{key}={v!r} must be an integer" + (f" >= {minimum}" if minimum is not None else ""))
        if minimum is not None and v < minimum:
            raise ConfigError(f"{key}={v} must be >= {minimum}")
        if maximum is not None and v > maximum:
            raise ConfigError(f"{key}={v} must be <= {maximum}")
        return v

    return check


def number(
    positive: bool = False, minimum: float | None = None, below: float | None = None, maximum: float | None = None
) -> Check:
    """A finite real number (ints accepted, returned as float) within the given bounds."""

    def check(key: str, v: Any) -> float:
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise ConfigError(f"{key}={v!r} must be a number")
        if not math.isfinite(v):
            raise ConfigError(f"{key}={v} must be a finite number")
        if positive and not v > 0:
            raise ConfigError(f"{key}={v} must be > 0")
        if minimum is not None and v < minimum:
            raise ConfigError(f"{key}={v} must be >= {minimum}")
        if below is not None and not v < below:
            raise ConfigError(f"{key}={v} must be < {below}")
        if maximum is not None and v > maximum:
            raise ConfigError(f"{key}={v} must be <= {maximum:g}")
        return float(v)

    return check


def power_of_two(key: str, v: Any) -> float:
    """A positive power of two (2**-k allowed), e.g. a loss scale: multiplying by it is exact."""
    v = number(positive=True, maximum=2.0**64)(key, v)
    if math.frexp(v)[0] != 0.5:
        lower = 2.0 ** (math.frexp(v)[1] - 1)
        raise ConfigError(
            f"{key}={v:g} must be a power of two (e.g. {lower:g} or {2 * lower:g}), "
            "so that scaling and unscaling gradients is exact"
        )
    return v


def boolean(key: str, v: Any) -> bool:
    if not isinstance(v, bool):
        raise ConfigError(f"{key}={v!r} must be true or false")
    return v


def choice(*allowed: str) -> Check:
    """One of `allowed`."""

    def check(key: str, v: Any) -> str:
        if v not in allowed:
            near = closest(v, allowed) if isinstance(v, str) else None
            hint = f"; did you mean {key}={near}?" if near else ""
            raise ConfigError(f"{key}={v!r} is not known; allowed: {', '.join(allowed)}{hint}")
        return v

    return check


def optional(inner: Check) -> Check:
    """None, or what `inner` accepts."""

    def check(key: str, v: Any) -> Any:
        return None if v is None else inner(key, v)

    return check


def string(key: str, v: Any) -> str:
    if not isinstance(v, str) or not v:
        raise ConfigError(f"{key}={v!r} must be a non-empty string")
    return v


def list_of(inner: Check, min_len: int = 0, max_len: int = 4096) -> Check:
    """A list (returned as a tuple) of `min_len` to `max_len` values, each checked by `inner`."""

    def check(key: str, v: Any) -> tuple:
        if not isinstance(v, (list, tuple)):
            raise ConfigError(f"{key}={v!r} must be a list, e.g. {key}=[a,b]")
        if len(v) < min_len:
            raise ConfigError(f"{key} must have at least {min_len} entries")
        if len(v) > max_len:
            raise ConfigError(f"{key} has {len(v)} entries; at most {max_len} are allowed")
        return tuple(inner(f"{key}[{i}]", x) for i, x in enumerate(v))

    return check


def int_or_list(minimum: int, maximum: int | None = None) -> Check:
    """One integer, or a list of them (a tuple)."""
    one = integer(minimum, maximum)

    def check(key: str, v: Any) -> Any:
        return list_of(one, 1)(key, v) if isinstance(v, (list, tuple)) else one(key, v)

    return check


def _or_word(word: str, inner: Check, what: str) -> Check:
    """The string `word` (e.g. `auto`), or what `inner` accepts (`what` names it in the error line)."""

    def check(key: str, v: Any) -> Any:
        if v == word:
            return v
        if isinstance(v, str):
            raise ConfigError(f"{key}={v!r} must be {what} or {word}")
        return inner(key, v)

    return check


def int_or_word(word: str, minimum: int, maximum: int | None = None) -> Check:
    """One integer, or the string `word` (e.g. `auto`)."""
    one = integer(minimum, maximum)
    return _or_word(word, one, "an integer")


def list_or_word(word: str, inner: Check, min_len: int = 1) -> Check:
    """A list of values each checked by `inner` (a tuple), or the string `word` (e.g. `auto`)."""
    listed = list_of(inner, min_len)
    return _or_word(word, listed, "a list, e.g. [a,b],")


def address(key: str, v: Any) -> str:
    """`host:port` of a server (a cluster worker)."""
    if not isinstance(v, str) or v.count(":") != 1:
        raise ConfigError(f"{key}={v!r} must be host:port, e.g. localhost:2222")
    host, port = v.split(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ConfigError(f"{key}={v!r} must be host:port with a port in 1..65535, e.g. localhost:2222")
    return v


def mapping(inner: Check, max_len: int = 4096) -> Check:
    """A mapping of names to values, each checked by `inner`; returned as a tuple of
    `(name, value)` pairs in the given order (hashable, like the rest of the settings)."""

    def check(key: str, v: Any) -> tuple:
        if not isinstance(v, dict):
            raise ConfigError(f"{key}={v!r} must be a mapping, e.g. {key}={{name: value}}")
        if len(v) > max_len:
            raise ConfigError(f"{key} has {len(v)} entries; at most {max_len} are allowed")
        for k in v:
            if not isinstance(k, str) or not k:
                raise ConfigError(f"{key} has the key {k!r}; keys must be non-empty names")
        return tuple((k, inner(f"{key}.{k}", x)) for k, x in v.items())

    return check


UNSET = (None, "???")  # null, or Hydra's mandatory-value marker


def required(inner: Check, example: str) -> Check:
    """A value that has no default: unset (null or `???`) is one line showing `example`."""

    def check(key: str, v: Any) -> Any:
        if v in UNSET:
            raise ConfigError(f"{key} is not set: {example}")
        return inner(key, v)

    return check


def dotted_name(key: str, v: Any) -> str:
    """A Python object's dotted path, `package.module.name` (what Hydra's `_target_` takes)."""
    parts = v.split(".") if isinstance(v, str) else []
    if len(parts) < 2 or not all(p.isidentifier() for p in parts):
        raise ConfigError(f"{key}={v!r} must be a dotted path to a function, e.g. mypackage.data.make_dataset")
    return v


FEATURE_DTYPES = ("float32", "int64")


def feature(key: str, v: Any) -> tuple:
    """A fixed-length TFRecord feature, `DTYPE` (one value) or `DTYPE[d1,d2,...]`, DTYPE float32 or
    int64, or `int64[None]` (ids of any length: length buckets); returned as `(dtype, shape)`."""
    text = v.replace(" ", "") if isinstance(v, str) else ""
    if text == "int64[None]":
        return "int64", (None,)
    dtype, bracket, dims = text.partition("[")
    shape: tuple = ()
    ok = dtype in FEATURE_DTYPES and (not bracket or dims.endswith("]"))
    if ok and bracket and dims[:-1]:
        parts = dims[:-1].split(",")
        ok = all(p.isdigit() and int(p) > 0 for p in parts)
        shape = tuple(int(p) for p in parts) if ok else ()
    if not ok:
        raise ConfigError(
            f"{key}={v!r} must be a fixed-length feature: float32 or int64, with its shape in "
            "brackets unless it holds one value, e.g. float32[28,28,1] or int64; or int64[None] (ids of any length)"
        )
    return dtype, shape


def step_window(key: str, v: Any) -> tuple[int, int]:
    """`[START, STOP]`: steps START to STOP, both counted from 1, START <= STOP."""
    start, stop = list_of(integer(1), 2, 2)(key, v) if isinstance(v, (list, tuple)) else (None, None)
    if start is None:
        raise ConfigError(f"{key}={v!r} must be [START,STOP], e.g. {key}=[5,6]")
    if start > stop:
        raise ConfigError(f"{key}=[{start},{stop}]: START must be <= STOP")
    return start, stop
