"""The one place records meet JSON: `to_json` writes a record as the dict a file holds, `from_json`
reads one back, checking each value's type, and `fields_of` lists a record's JSON fields with
their meanings (the docs' field lists are generated from it, `scripts/summary_reference.py`).

A record is a dataclass whose fields are declared with `item(help=...)`. A field's JSON key is
its name. Options of `item`:

- `section`: the field holds an optional group of fields (a record) that the JSON keeps at the
  same level as its holder's own (`summary.json` keeps the schedule's fields beside the run's);
  None when the group does not apply, and then none of its keys is written;
- `omit_none`: the key is left out when the value is None (it exists only when it applies).

Reading is lenient about what is missing (a key not in the file reads as None: a run of an
older version, or one a user trimmed) and strict about what is there: a value of another type
is a `RecordError` naming the key (`stages[1].device`), so a damaged file is never drawn as
something else. Keys the record does not know are ignored.

No TensorFlow, and nothing of chain but `chain.errors`.
"""

from __future__ import annotations

import dataclasses
import json
import typing
from typing import Any, Iterator, TypeVar, Union

from chain.errors import ChainError

R = TypeVar("R")
NUMBER = "number"


class RecordError(ChainError, ValueError):
    """A JSON value that is not what the record's field holds (the message names the key)."""


def item(
    help: str,
    *,
    default: Any = dataclasses.MISSING,
    factory: Any = dataclasses.MISSING,
    section: bool = False,
    omit_none: bool = False,
) -> Any:
    """A record's field with its one-line meaning (`help`, shown in the docs' field lists)."""
    meta = {"help": help, "section": section, "omit_none": omit_none}
    if factory is not dataclasses.MISSING:
        return dataclasses.field(default_factory=factory, metadata=meta)
    return dataclasses.field(default=default, metadata=meta)


def _meta(f: dataclasses.Field) -> dict:
    return f.metadata if "help" in f.metadata else {"help": "", "section": False, "omit_none": False}


def to_json(record: Any) -> dict[str, Any]:
    """`record` as the JSON object a file holds (sections merged into it, absent ones left out)."""
    out: dict[str, Any] = {}
    for f in dataclasses.fields(record):
        meta, value = _meta(f), getattr(record, f.name)
        if meta["section"]:
            if value is not None:
                out.update(to_json(value))
            continue
        if value is None and meta["omit_none"]:
            continue
        out[f.name] = _value_to_json(value)
    return out


def _value_to_json(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return to_json(value)
    if isinstance(value, (list, tuple)):
        return [_value_to_json(v) for v in value]
    if isinstance(value, dict):
        return {k: _value_to_json(v) for k, v in value.items()}
    return value


def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _check(value: Any, hint: Any, where: str) -> Any:
    """`value` if it has the type `hint` says (None always passes), else a RecordError naming `where`."""
    if value is None or hint is Any:
        return value
    origin = typing.get_origin(hint)
    if origin is Union or type(hint).__name__ == "UnionType":
        options = [h for h in typing.get_args(hint) if h is not type(None)]
        errors = []
        for h in options:
            try:
                return _check(value, h, where)
            except RecordError as e:
                errors.append(e)
        raise errors[0]
    if hint is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return value
        raise _wrong(where, "a number", value)
    if hint in (int, str, bool):
        if isinstance(value, hint) and (hint is bool or not isinstance(value, bool)):
            return value
        raise _wrong(where, {int: "an integer", str: "a string", bool: "true or false"}[hint], value)
    if origin in (list, tuple):
        if not isinstance(value, list):
            raise _wrong(where, "a list", value)
        (element,) = typing.get_args(hint)[:1] or (Any,)
        return [_check(v, element, f"{where}[{i}]") for i, v in enumerate(value)]
    if origin is dict or hint is dict:
        if not isinstance(value, dict):
            raise _wrong(where, "an object", value)
        return value
    if dataclasses.is_dataclass(hint):
        if not isinstance(value, dict):
            raise _wrong(where, "an object", value)
        return from_json(hint, value, where)
    return value


def _wrong(where: str, want: str, value: Any) -> RecordError:
    return RecordError(f"{where} must be {want} or null, not {json.dumps(value)[:40]}")


def from_json(cls: type[R], obj: Any, where: str = "") -> R:
    """The record of type `cls` that the JSON object `obj` holds (see the module docstring)."""
    if not isinstance(obj, dict):
        raise RecordError(f"{where or 'the document'} must be a JSON object")
    hints = _hints(cls)
    values: dict[str, Any] = {}
    for f in dataclasses.fields(cls):
        meta, hint = _meta(f), hints[f.name]
        key = f"{where}.{f.name}" if where else f.name
        if meta["section"]:
            section = _section_type(hint)
            names = [g.name for g in dataclasses.fields(section)]
            values[f.name] = from_json(section, obj, where) if any(n in obj for n in names) else None
            continue
        values[f.name] = _check(obj.get(f.name), hint, key)
    return cls(**values)


def _section_type(hint: Any) -> type:
    """The record type of a section field (`X | None`)."""
    return next(h for h in typing.get_args(hint) or (hint,) if h is not type(None))


def fields_of(cls: type, sections: bool = True) -> Iterator[tuple[str, str, Any]]:
    """(JSON key, meaning, section record type or None) for every field of `cls`; a section's
    fields are listed under it when `sections` (the key is then the section's field name)."""
    for f in dataclasses.fields(cls):
        meta = _meta(f)
        if meta["section"]:
            section = _section_type(_hints(cls)[f.name])
            yield f.name, meta["help"], section
            if sections:
                yield from ((k, h, s) for k, h, s in fields_of(section))
        else:
            yield f.name, meta["help"], None


def keys(cls: type) -> set[str]:
    """Every JSON key a record of `cls` may hold, nested records' included."""
    out: set[str] = set()
    hints = _hints(cls)
    for f in dataclasses.fields(cls):
        meta = _meta(f)
        if meta["section"]:
            out |= keys(_section_type(hints[f.name]))
            continue
        out.add(f.name)
        for inner in _records_in(hints[f.name]):
            out |= keys(inner)
    return out


def _records_in(hint: Any) -> list[type]:
    """The record types a field's type holds (`list[StageSummary] | None` -> [StageSummary])."""
    if dataclasses.is_dataclass(hint):
        return [hint]
    return [r for h in typing.get_args(hint) for r in _records_in(h)]
