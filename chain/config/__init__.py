"""Configs: compose the packaged Hydra configs with overrides and validate them, once, into
a typed, frozen `Settings` (nothing here imports TensorFlow, so a bad config fails in
well under a second; a `_target_`'s module is imported to check what it names, and TensorFlow with it
when the module needs it).

    settings = chain.config.compose(["+stages=3", "trainer.steps=5"])   # -> Settings
    settings = chain.config.validate(hydra_cfg)                          # a composed DictConfig
    settings, info = chain.config.validate_and_describe(hydra_cfg)      # and the data's description

Modules: `schema` (the sections as dataclasses; each key's check comes from `chain.fields`, the
`data` section's forms from `chain.data.sources`), `checks` (what must hold across keys),
`shapes` (stage shapes and sizes from the config alone), `device_names` (device-name syntax),
`variants` (side-by-side models), `named_code` (every `_target_` resolved and its kind checked, nothing
called), `hydra` (the packaged config groups and overrides), the schedule
a run's settings ask for and its checks (`schedule_choice`, over `chain.schedule`; `pipeline.schedule`'s
names are the schema's choice, from `chain.schedule.schedules`). What the config cannot know by
itself (the devices, the schedule built once for the run) is the preparation pass's, `chain.prepared`.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Sequence

from omegaconf import DictConfig, MissingMandatoryValue, OmegaConf

from chain.config import checks, named_code
from chain.config.hydra import compose_config, group_defaults, group_options, normalize_overrides, override_key
from chain.config.schema import Settings, expand_stages, parse
from chain.config.variants import expand as expand_variants
from chain.data.catalog import DataInfo
from chain.data.sources import describe
from chain.errors import ConfigError, first_line

__all__ = [
    "Settings",
    "compose",
    "validate",
    "validate_and_describe",
    "group_options",
    "normalize_overrides",
    "override_key",
]


def validate(cfg: DictConfig | dict[str, Any] | Settings) -> Settings:
    """Check a composed config (every key, and what must hold across keys) and return its `Settings`.

    Raises `ConfigError` with one line naming the key. A `Settings` is returned as it is.
    """
    return cfg if isinstance(cfg, Settings) else validate_and_describe(cfg)[0]


def validate_and_describe(cfg: DictConfig | dict[str, Any]) -> tuple[Settings, DataInfo | None]:
    """`validate`, returning also the data set's description it checked the settings against
    (made once, here; None for data only TensorFlow reads). Every `_target_` is resolved and its kind
    checked last (`named_code`: it imports the targets' modules), nothing of it called."""
    s = _parse(cfg)
    info = describe(s.data)
    s = checks.settle(s, info)
    checks.check_auto_plan(s, info)  # the user's config only: a chosen plan's is settled again
    named_code.check(s)
    return s, info


def _parse(cfg: DictConfig | dict[str, Any]) -> Settings:
    """Every key of `cfg` checked and the stages expanded; nothing across keys yet."""
    source = cfg if isinstance(cfg, DictConfig) else OmegaConf.create(cfg)
    if "hydra" in source:  # Hydra's own node (run directory etc.) resolves only inside a Hydra job
        source = OmegaConf.masked_copy(source, [k for k in source if k != "hydra"])
    try:
        raw = OmegaConf.to_container(source, resolve=True, throw_on_missing=True)
    except MissingMandatoryValue as e:  # a `???` the command line did not fill
        key = e.full_key.replace("stage.", "", 1) if e.full_key.startswith("stage.") else e.full_key
        raise ConfigError(f"{key} needs a value: set it on the command line, e.g. {key}=...") from None
    except Exception as e:  # an interpolation that does not resolve
        raise ConfigError(f"config does not resolve: {first_line(e, typed=False)}") from None
    stages, variants, grid = raw.pop("stages", None), raw.pop("variants", None), raw.pop("grid", None)
    s = parse(Settings, "", raw)
    if s.mode == "side_by_side":
        if stages is not None:
            raise ConfigError(
                "mode=side_by_side trains independent models: list them with +variants=[...] or "
                "+grid={...}, not +stages"
            )
        specs, records = expand_variants(variants, grid, s.stage, s.data.batch_size, group_defaults)
        s = replace(s, stages=specs, variants=records, source=source)
    elif variants is not None or grid is not None:
        raise ConfigError(
            f"+{'variants' if variants is not None else 'grid'} lists independent models: it needs mode=side_by_side"
        )
    else:
        s = replace(s, stages=expand_stages(stages, s.stage, group_defaults), source=source)
    return s


def compose(overrides: Sequence[str] = ()) -> Settings:
    """Compose the packaged configs with command-line style overrides and validate them.

    Example: `chain.compose(["+stages=3", "trainer.steps=5"])`.
    """
    return validate(compose_config(overrides))
