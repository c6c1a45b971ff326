"""Hydra's side of configs: the packaged config groups, command-line overrides, compose.

The configs travel inside the package as `chain.conf` (`pkg://chain.conf`), so a wheel
finds them from any directory. Nothing here imports TensorFlow.
"""

from __future__ import annotations

import re
from importlib import resources
from typing import Sequence

from omegaconf import DictConfig, OmegaConf

from chain.errors import ConfigError, closest, did_you_mean, first_line

CONFIG_MODULE = "chain.conf"
GROUPS = ("model", "optim", "data")
# The option a `GROUP._target_=...` override selects: a callable of the user's in place of a packaged option.
TARGET_OPTIONS = {"model": "builder", "optim": "target"}


def group_options(group: str) -> list[str]:
    """Names of the packaged configs of one group (`model` -> ['conv', 'mlp'])."""
    folder = resources.files(CONFIG_MODULE).joinpath(group)
    return sorted(p.name[: -len(".yaml")] for p in folder.iterdir() if p.name.endswith(".yaml"))


def unknown_option(group: str, name: str) -> str:
    """The one-line message for `group=name`, an option the group does not have."""
    near = closest(name, group_options(group))
    hint = f"; did you mean {group}={near}?" if near else ""
    return f"{group}={name!r} is not known; allowed: {', '.join(group_options(group))}{hint}"


def group_defaults(group: str, name: str) -> dict:
    """The packaged config `group/name.yaml` as a dict, or a ConfigError naming the options."""
    if name not in group_options(group):
        raise ConfigError(unknown_option(group, name))
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
    # `model._target_=mypkg.nets.block`: the model is a builder (conf/model/builder.yaml) whose
    # other keys are new ones, the builder's keyword arguments (Hydra needs ++ to add them);
    # `optim._target_=keras.optimizers.RMSprop` likewise selects conf/optim/target.yaml.
    targets = [
        g
        for g in TARGET_OPTIONS
        if any(override_key(o) == f"{g}._target_" for o in overrides)
        and not any(override_key(o) == g for o in overrides)
    ]
    out += [f"{g}={TARGET_OPTIONS[g]}" for g in targets]
    for o in overrides:
        key, sep, value = o.partition("=")
        bare = override_key(o)
        group = bare.partition(".")[0]
        if bare in ("stages", "variants", "grid") and sep:
            o = f"++{bare}={value}"
        elif bare in GROUPS and sep and not key.startswith("~"):
            if value not in group_options(bare):
                raise ConfigError(unknown_option(bare, value))
        elif group in targets and "." in bare and sep:
            o = f"{bare}={value}" if bare == f"{group}._target_" else f"++{bare}={value}"
        out.append(o)
    return out


def _compose(overrides: Sequence[str], with_hydra: bool) -> DictConfig:
    from hydra import compose as hydra_compose
    from hydra import initialize_config_module
    from hydra.core.global_hydra import GlobalHydra

    GlobalHydra.instance().clear()
    try:
        with initialize_config_module(config_module=CONFIG_MODULE, version_base="1.3"):
            return hydra_compose(config_name="config", overrides=list(overrides), return_hydra_config=with_hydra)
    finally:
        GlobalHydra.instance().clear()


def dotted_keys(node: object, prefix: str = "") -> list[str]:
    """Every key of a plain config mapping, dotted (`trainer.steps`), nested ones included."""
    if not isinstance(node, dict):
        return []
    out = []
    for k, v in node.items():
        key = f"{prefix}{k}"
        out += [key, *dotted_keys(v, f"{key}.")]
    return out


def _unknown_key(key: str, overrides: Sequence[str]) -> str:
    """The one-line message for `key=value` on a key the config does not have, with the nearest
    key it may have meant (`chain.errors.did_you_mean`)."""
    parent, _, leaf = key.rpartition(".")
    try:
        cfg = _compose([o for o in overrides if override_key(o) != key], False)
        node = cfg
        for part in parent.split(".") if parent else ():
            node = node[part]
        allowed = ", ".join(sorted(str(k) for k in node))
    except Exception:  # the parent is not a mapping either: say what we can
        return f"unknown key {key}"
    where = f"of {parent}" if parent else "at the top level"
    known = dotted_keys(OmegaConf.to_container(cfg, resolve=False))
    return f"unknown key {key}; allowed keys {where}: {allowed}{did_you_mean(key, known)}"


def compose_config(overrides: Sequence[str] = (), with_hydra: bool = False) -> DictConfig:
    """The packaged config composed with command-line style overrides (no run directory).

    `with_hydra` keeps the `hydra` node (e.g. `hydra.run.dir`). Hydra's errors become one
    `ConfigError` line that names the key or the override.
    """
    from hydra.errors import ConfigCompositionException, HydraException, OverrideParseException

    overrides = normalize_overrides(overrides)
    try:
        return _compose(overrides, with_hydra)
    except OverrideParseException as e:
        raise ConfigError(
            f"cannot read the override {e.override}: {first_line(e, typed=False)} (lists are "
            "key=[a,b]; quote mappings for the shell: '+stages=[{model: conv},{}]')"
        ) from None
    except ConfigCompositionException as e:
        first = first_line(e, typed=False)
        if first.startswith("Could not override '"):
            raise ConfigError(_unknown_key(first.split("'")[1], overrides)) from None
        raise ConfigError(_with_hint(first)) from None
    except HydraException as e:
        raise ConfigError(_with_hint(first_line(e, typed=False))) from None


def _with_hint(message: str) -> str:
    """Hydra's message, with what to do when it is a sweep given without --multirun."""
    if message.startswith("Ambiguous value for argument"):
        return (
            f"{message}: several values are a sweep, which needs --multirun before the overrides "
            "(python -m chain --multirun a=1,2); a list is key=[a,b]"
        )
    return message


def quoted(value: str, key: str) -> str:
    """`value` as a Hydra override value that reads back as exactly `value`: as it is when it
    can be, else quoted (a path with `,`, `(`, `=`, `'` or spaces would otherwise be read as a
    sweep, a function or a parse error); a ConfigError naming `key` for what cannot be passed on."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    def reads_back(text: str) -> bool:
        try:
            return OverridesParser.create().parse_overrides([f"{key}={text}"])[0].value() == value
        except Exception:  # noqa: BLE001 - any parse failure means: not this way
            return False

    if "${" not in value:  # an interpolation would be resolved again
        if reads_back(value):
            return value
        # Hydra's rule: a backslash is literal unless it precedes a quote or ends the string.
        text = "'" + re.sub(r"(\\+)(?='|$)", lambda m: m.group(1) * 2, value).replace("'", "\\'") + "'"
        if reads_back(text):
            return text
    raise ConfigError(
        f"{key}={value!r} cannot be passed on to Hydra exactly (it would read another value, "
        "e.g. '${' as an interpolation); choose another directory name"
    )


def check_job_name(cfg: DictConfig) -> None:
    """`hydra.job.name` names the run's log file (RUN_DIR/NAME.log): a ConfigError unless it is a plain
    file name, so the log cannot land outside the run directory."""
    name = str(cfg.hydra.job.name)
    if not name or name in (".", "..") or any(c in name for c in ("/", "\\", "\0")) or not name.isprintable():
        raise ConfigError(
            f"hydra.job.name={name!r} must be a plain file name (no '/', '\\' or '..'): it names "
            "the run's log, RUN_DIR/NAME.log"
        )


def check_flag_order(args: Sequence[str]) -> None:
    """A ConfigError for overrides Hydra's command line would not read: Hydra takes one group of
    overrides, so `a=b --multirun c=d` fails on `c=d` with a usage dump."""
    from chain.internals.hydra_private import args_parser

    _, unread = args_parser().parse_known_args(list(args))
    stray = [a for a in unread if not a.startswith("-")]
    if stray:
        raise ConfigError(
            f"{' '.join(stray)}: overrides on both sides of a flag are not read by Hydra; put the "
            "flags first, then every override: python -m chain --multirun a=1,2 b=3"
        )


def sweep_jobs(overrides: Sequence[str]) -> list[list[str]]:
    """The jobs `--multirun` makes of `overrides` (each one's overrides), as Hydra's basic sweeper
    expands them (`optim.lr=0.1,0.01 seed=0,1`: four jobs)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException

    from chain.internals.hydra_private import split_sweep

    try:
        parsed = OverridesParser.create().parse_overrides(list(overrides))
    except HydraException as e:
        raise ConfigError(first_line(e, typed=False)) from None
    return [job for batch in split_sweep(parsed) for job in batch]
