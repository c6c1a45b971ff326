"""Variants for `mode=side_by_side`: independent models, each the base config with a few overrides.

    +variants=[{optim.lr: 1e-3}, {optim.lr: 3e-4, model.width: 256}]
    +grid={optim.lr: [1e-3, 3e-4], model.width: [128, 256]}        # 4 models

A variant's keys: `model`, `model.KEY` (its `_target_` included), `optim`, `optim.KEY`,
`target`, `data.batch_size` (its own slice of every shared batch), `paused` (kept and
checkpointed, not trained) and `name`. Each becomes a stage spec (the `stage` template with
the overrides, as `+stages=[...]` entries are) and a `Variant` record; a variant is named by
its overrides unless it says otherwise.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any, Callable

from chain.fields import boolean, integer, string
from chain.config.schema import MAX_BATCH, MAX_STAGES, StageSpec, expand_stages
from chain.errors import ConfigError

GROUPS = ("model", "optim")
OWN_KEYS = ("target", "data.batch_size", "paused", "name")


@dataclass(frozen=True)
class Variant:
    """One model of a side-by-side run: its name, its overrides, its batch size, whether it trains."""

    name: str
    overrides: tuple[tuple[str, Any], ...]
    batch_size: int
    paused: bool


def _label(value: Any) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


def _stage_override(key: str, entry: dict[str, Any]) -> dict[str, Any]:
    """Dotted variant keys as a `+stages=[...]` entry: {model: {width: 256}, optim: {lr: ...}, target: ...}."""
    out: dict[str, Any] = {}
    for k, v in entry.items():
        group, _, leaf = k.partition(".")
        if group in GROUPS and leaf:
            if isinstance(out.get(group), str):  # `model: conv` then `model.filters: 8`
                out[group] = {"name": out[group]}
            out.setdefault(group, {})[leaf] = v
        elif k in GROUPS:
            if isinstance(out.get(group), dict):
                out[group] = {"name": v, **out[group]} if isinstance(v, str) else {**v, **out[group]}
            else:
                out[group] = v
        elif k == "target":
            out["target"] = v
        elif k not in OWN_KEYS:
            raise ConfigError(
                f"unknown key {key}.{k}; a variant sets model, model.KEY, optim, optim.KEY, {', '.join(OWN_KEYS)}"
            )
    return out


def expand(
    variants: Any, grid: Any, template: StageSpec, base_batch: int, group_defaults: Callable[[str, str], dict]
) -> tuple[tuple[StageSpec, ...], tuple[Variant, ...]]:
    """The stage specs and `Variant`s of `+variants=[...]` or `+grid={...}` (exactly one of them)."""
    if variants is not None and grid is not None:
        raise ConfigError("+variants and +grid both list the models: give one of them")
    if grid is not None:
        if not isinstance(grid, dict) or not grid:
            raise ConfigError(f"grid={grid!r} must map keys to lists of values, e.g. +grid={{optim.lr: [1e-3, 3e-4]}}")
        for k, values in grid.items():
            if not isinstance(values, list) or not values:
                raise ConfigError(f"grid.{k}={values!r} must be a non-empty list of values")
        size = 1
        for values in grid.values():
            size *= len(values)
        if size > MAX_STAGES:
            raise ConfigError(f"grid has {size} combinations; at most {MAX_STAGES} models side by side")
        variants = [dict(zip(grid, combo)) for combo in itertools.product(*grid.values())]
        key = "grid"
    else:
        key = "variants"
    if not isinstance(variants, list) or not variants:
        raise ConfigError(
            "mode=side_by_side trains several models: give them with +variants=[{...},...] or +grid={key: [values]}"
        )
    if len(variants) > MAX_STAGES:
        raise ConfigError(f"variants has {len(variants)} entries; at most {MAX_STAGES} models side by side")
    entries, records, names = [], [], set()
    for i, entry in enumerate(variants):
        where = f"{key}[{i}]"
        entry = {} if entry is None else entry
        if not isinstance(entry, dict):
            raise ConfigError(f"{where}={entry!r} must be a mapping of overrides, e.g. {{optim.lr: 0.001}}")
        entries.append(_stage_override(where, entry))
        batch = integer(1, MAX_BATCH)(f"{where}.data.batch_size", entry.get("data.batch_size", base_batch))
        paused = boolean(f"{where}.paused", entry.get("paused", False))
        shown = [(k, v) for k, v in entry.items() if k not in ("name", "paused")]
        name = (
            string(f"{where}.name", entry["name"])
            if "name" in entry
            else (",".join(f"{k}={_label(v)}" for k, v in shown) or "base")
        )
        if name in names:
            raise ConfigError(f"{where} is named {name!r} like another variant; give it a name: {where}.name=...")
        names.add(name)
        records.append(Variant(name, tuple(shown), batch, paused))
    return expand_stages(entries, template, group_defaults, key), tuple(records)
