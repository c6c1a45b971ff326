"""Composing and validating configs: the packaged Hydra configs, overrides, the schema.

Nothing here imports TensorFlow, so a bad config fails in well under a second.
"""

from __future__ import annotations

from importlib import resources
from typing import Any, Sequence

from omegaconf import DictConfig, OmegaConf

from chain import schema
from chain.errors import ConfigError

CONFIG_MODULE = "chain.conf"
GROUPS = ("model", "optim", "data")


def group_options(group: str) -> list[str]:
    """Names of the packaged configs of one group (`model` -> ['conv', 'mlp'])."""
    folder = resources.files(CONFIG_MODULE).joinpath(group)
    return sorted(p.name[: -len(".yaml")] for p in folder.iterdir() if p.name.endswith(".yaml"))


def group_defaults(group: str, name: str) -> dict:
    """The packaged config `group/name.yaml` as a dict, or a ConfigError naming the options."""
    if name not in group_options(group):
        raise ConfigError(f"{group}={name!r} is not known; allowed: {', '.join(group_options(group))}")
    text = resources.files(CONFIG_MODULE).joinpath(group, f"{name}.yaml").read_text()
    return OmegaConf.to_container(OmegaConf.create(text))


def override_key(override: str) -> str:
    """The key an override sets: `+stages=3`, `++stages=3`, `~stages` -> `stages`."""
    return override.partition("=")[0].lstrip("+~")


def normalize_overrides(overrides: Sequence[str]) -> list[str]:
    """Accept both `stages=N` and `+stages=N`; check config-group names before Hydra does.

    `stages` is not in the base config (so `+stages` is the natural form); `++` adds or
    replaces, so either spelling works. Group names are checked here because Hydra's own
    message for an unknown group option is a multi-line search-path dump.
    """
    out = []
    for o in overrides:
        key, sep, value = o.partition("=")
        bare = override_key(o)
        if bare == "stages" and sep:
            o = f"++stages={value}"
        elif bare in GROUPS and sep and not key.startswith("~"):
            if value not in group_options(bare):
                raise ConfigError(f"{bare}={value!r} is not known; allowed: {', '.join(group_options(bare))}")
        out.append(o)
    return out


def compose(overrides: Sequence[str] = ()) -> DictConfig:
    """Compose the packaged configs with command-line style overrides (no run directory).

    Example: `chain.compose(["+stages=3", "trainer.steps=5"])`.
    """
    from hydra import compose as hydra_compose
    from hydra import initialize_config_module
    from hydra.core.global_hydra import GlobalHydra
    from hydra.errors import HydraException

    GlobalHydra.instance().clear()
    try:
        with initialize_config_module(config_module=CONFIG_MODULE, version_base="1.3"):
            cfg = hydra_compose(config_name="config", overrides=normalize_overrides(overrides))
    except HydraException as e:
        raise ConfigError(str(e).splitlines()[0]) from None
    finally:
        GlobalHydra.instance().clear()
    settings(cfg)  # fail early, like the CLI does
    return cfg


def settings(cfg: DictConfig | dict[str, Any]) -> dict[str, Any]:
    """Validate a composed config and return it as a plain dict with `stages` expanded."""
    if isinstance(cfg, dict):
        cfg = OmegaConf.create(cfg)
    return schema.validate(cfg, group_defaults)
