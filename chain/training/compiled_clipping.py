"""The gradient clipping of a user's compiled Keras model, kept when the chain trains it.

A model cut into stages (`model=keras`, or `chain.build(cfg, model=...)`) trains with the chain's
`optim=` and `loss=`, not its compiled optimizer. Its optimizer's clipping is the one part a
user would not expect to lose without a word: a model compiled with `global_clipnorm=C` (or
`clipnorm=C`) trains with `optim.clip_global_norm=C` (`optim.clip_norm=C`) unless the config
sets a clipping of its own, and a note says which applies. `clipvalue` has no counterpart:
a note says it is not applied.
"""

from __future__ import annotations

import json
import zipfile
from dataclasses import replace
from typing import Any

from chain.config.schema import Settings

KERAS_KEYS = {"global_clipnorm": "clip_global_norm", "clipnorm": "clip_norm"}


def _inner(config: dict | None) -> dict:
    """An optimizer's config, a `LossScaleOptimizer`'s inner optimizer's (where clipping lives)."""
    config = config or {}
    inner = config.get("inner_optimizer")
    if isinstance(inner, dict):
        return _inner(inner.get("config", inner))
    return config


def of_model(model: Any) -> dict:
    """The clipping settings (`global_clipnorm`, `clipnorm`, `clipvalue`: those set) of `model`'s
    compiled optimizer; {} for a model not compiled."""
    optimizer = getattr(model, "optimizer", None)
    if optimizer is None:
        return {}
    return _set(_inner(optimizer.get_config()))


def of_file(path: str) -> dict:
    """The same for a `.keras` file's compiled optimizer (its `config.json`, read without loading it)."""
    try:
        with zipfile.ZipFile(path) as z:
            config = json.loads(z.read("config.json"))
    except (OSError, KeyError, ValueError, zipfile.BadZipFile):
        return {}  # the loader already read the file; an older format has nothing for us
    optimizer = (config.get("compile_config") or {}).get("optimizer")
    return _set(_inner(optimizer.get("config") if isinstance(optimizer, dict) else None))


def _set(config: dict) -> dict:
    return {k: float(config[k]) for k in ("global_clipnorm", "clipnorm", "clipvalue") if config.get(k)}


def adopt(settings: Settings, clips: dict, name: str) -> tuple[Settings, list[str]]:
    """`settings` with the compiled optimizer's `clips` (`of_model`/`of_file`) as every stage's
    `optim.clip_*` when the config sets no clipping, and the notes saying what applies."""
    if not clips:
        return settings, []
    notes = []
    if "clipvalue" in clips:
        notes.append(
            f"{name} was compiled with clipvalue={clips['clipvalue']}: not applied (the chain clips by "
            "norm only: optim.clip_norm, optim.clip_global_norm)"
        )
    by_norm = {KERAS_KEYS[k]: v for k, v in clips.items() if k in KERAS_KEYS}
    if not by_norm:
        return settings, notes
    keras_text = ", ".join(f"{k}={v}" for k, v in clips.items() if k in KERAS_KEYS)
    configured = any(s.optim.clip_norm is not None or s.optim.clip_global_norm is not None for s in settings.stages)
    if configured:
        notes.append(f"{name} was compiled with {keras_text}: the config's optim.clip_* apply instead")
        return settings, notes
    stages = tuple(replace(s, optim=replace(s.optim, **by_norm)) for s in settings.stages)
    ours = ", ".join(f"optim.{k}={v}" for k, v in by_norm.items())
    notes.append(
        f"{name} was compiled with {keras_text}: the chain clips as {ours} (set optim.clip_norm or "
        "optim.clip_global_norm to choose otherwise)"
    )
    return replace(settings, stages=stages), notes


def honour(settings: Settings, model: Any, notes: list[str]) -> Settings:
    """`adopt` for the model a run cuts into stages (`model`, or the config's `model=keras` file),
    its notes appended to `notes` (the placement's); `settings` unchanged for any other run."""
    from chain.config.schema import KerasModel

    spec = settings.stages[0].model
    if model is not None:
        clips, name = of_model(model), model.name or "model"
    elif isinstance(spec, KerasModel):
        clips, name = of_file(spec.path), spec.path
    else:
        return settings
    settings, found = adopt(settings, clips, name)
    notes.extend(found)
    return settings
