"""The one config schema: every key, its type and its allowed values.

`validate(cfg)` runs on the composed Hydra config before TensorFlow starts and raises
`ConfigError` with one line that names the key and says what is allowed. Unknown keys
are rejected at every depth, because Hydra accepts `+trainer.stepz=5` silently.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from omegaconf import DictConfig, OmegaConf

from chain.errors import ConfigError

MODES = ("local", "e2e")
LOSSES = ("sparse_categorical_crossentropy", "mse")
PRECISIONS = ("float32", "mixed_float16", "mixed_bfloat16")
SCHEDULES = ("sequential", "gpipe", "1f1b")
FALLBACKS = ("virtual", "mirrored", "error")
ON_NAN = ("stop", "skip")
DATA_SETS = ("digits", "synthetic")
ACTIVATIONS = ("relu", "gelu", "tanh", "sigmoid", "linear")


# --- field checks -------------------------------------------------------------------
# Each check takes (key, value) and returns the (possibly normalised) value or raises.


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def integer(minimum: int | None = None) -> Callable[[str, Any], Any]:
    def check(key: str, v: Any) -> Any:
        if not _is_int(v):
            raise ConfigError(f"{key}={v!r} must be an integer" + (f" >= {minimum}" if minimum is not None else ""))
        if minimum is not None and v < minimum:
            raise ConfigError(f"{key}={v} must be >= {minimum}")
        return v

    return check


def number(positive: bool = False, minimum: float | None = None, below: float | None = None) -> Callable[[str, Any], Any]:
    def check(key: str, v: Any) -> Any:
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise ConfigError(f"{key}={v!r} must be a number")
        if positive and not v > 0:
            raise ConfigError(f"{key}={v} must be > 0")
        if minimum is not None and v < minimum:
            raise ConfigError(f"{key}={v} must be >= {minimum}")
        if below is not None and not v < below:
            raise ConfigError(f"{key}={v} must be < {below}")
        return float(v)

    return check


def power_of_two(key: str, v: Any) -> Any:
    """A positive power of two (2**-k allowed), e.g. a loss scale: multiplying by it is exact."""
    import math

    v = number(positive=True)(key, v)
    if math.frexp(v)[0] != 0.5:
        lower = 2.0 ** (math.frexp(v)[1] - 1)
        raise ConfigError(f"{key}={v:g} must be a power of two (e.g. {lower:g} or {2 * lower:g}), "
                          "so that scaling and unscaling gradients is exact")
    return v


def boolean(key: str, v: Any) -> Any:
    if not isinstance(v, bool):
        raise ConfigError(f"{key}={v!r} must be true or false")
    return v


def choice(*allowed: str) -> Callable[[str, Any], Any]:
    def check(key: str, v: Any) -> Any:
        if v not in allowed:
            raise ConfigError(f"{key}={v!r} is not known; allowed: {', '.join(allowed)}")
        return v

    return check


def optional(inner: Callable[[str, Any], Any]) -> Callable[[str, Any], Any]:
    def check(key: str, v: Any) -> Any:
        return None if v is None else inner(key, v)

    return check


def string(key: str, v: Any) -> Any:
    if not isinstance(v, str) or not v:
        raise ConfigError(f"{key}={v!r} must be a non-empty string")
    return v


def list_of(inner: Callable[[str, Any], Any], min_len: int = 0) -> Callable[[str, Any], Any]:
    def check(key: str, v: Any) -> Any:
        if not isinstance(v, (list, tuple)):
            raise ConfigError(f"{key}={v!r} must be a list, e.g. {key}=[a,b]")
        if len(v) < min_len:
            raise ConfigError(f"{key} must have at least {min_len} entries")
        return [inner(f"{key}[{i}]", x) for i, x in enumerate(v)]

    return check


def int_or_list(minimum: int) -> Callable[[str, Any], Any]:
    one = integer(minimum)

    def check(key: str, v: Any) -> Any:
        return list_of(one, 1)(key, v) if isinstance(v, (list, tuple)) else one(key, v)

    return check


@dataclass(frozen=True)
class Section:
    """A mapping with fixed keys; `variants` picks the key set by the value of `name`."""

    fields: dict[str, Callable[[str, Any], Any]] = field(default_factory=dict)
    variants: dict[str, dict[str, Callable[[str, Any], Any]]] = field(default_factory=dict)

    def __call__(self, key: str, v: Any) -> dict:
        if not isinstance(v, dict):
            raise ConfigError(f"{key} must be a mapping, got {v!r}")
        join = (lambda k: f"{key}.{k}") if key else (lambda k: k)
        fields = dict(self.fields)
        if self.variants:
            name = v.get("name")
            if name not in self.variants:
                raise ConfigError(f"{join('name')}={name!r} is not known; allowed: {', '.join(self.variants)}")
            fields.update(self.variants[name])
        unknown = sorted(set(v) - set(fields))
        if unknown:
            where = f"of {key}" if key else "at the top level"
            raise ConfigError(f"unknown key {join(unknown[0])}; allowed keys {where}: {', '.join(sorted(fields))}")
        missing = sorted(set(fields) - set(v))
        if missing:
            raise ConfigError(f"missing key {join(missing[0])}")
        return {k: check(join(k), v[k]) for k, check in fields.items()}


_common_layer = {"name": string, "depth": integer(1), "activation": choice(*ACTIVATIONS), "dropout": number(minimum=0.0, below=1.0)}
MODEL = Section(
    variants={
        "mlp": {**_common_layer, "width": integer(1)},
        "conv": {**_common_layer, "filters": integer(1), "kernel_size": integer(1)},
    }
)
OPTIM = Section(
    fields={"name": string, "lr": number(positive=True)},
    variants={
        "sgd": {"momentum": number(minimum=0.0)},
        "adam": {"beta_1": number(minimum=0.0, below=1.0), "beta_2": number(minimum=0.0, below=1.0)},
    },
)
DATA = Section(
    fields={"name": string, "batch_size": integer(1), "shuffle": boolean},
    variants={
        "digits": {},
        "synthetic": {"samples": integer(1), "features": integer(1), "classes": integer(2)},
    },
)
STAGE = Section(fields={"model": MODEL, "optim": OPTIM, "target": optional(string)})

ROOT = Section(
    fields={
        "seed": integer(0),
        "mode": choice(*MODES),
        "loss": choice(*LOSSES),
        "precision": choice(*PRECISIONS),
        "resume": boolean,
        "plan_only": boolean,
        "model": MODEL,
        "optim": OPTIM,
        "data": DATA,
        "stage": STAGE,
        "trainer": Section(
            fields={
                "steps": integer(1),
                "log_every": integer(1),
                "progress": boolean,
                "jit_compile": boolean,
                "grad_accum": integer(1),
                "initial_loss_scale": power_of_two,
                "on_nan": choice(*ON_NAN),
            }
        ),
        "pipeline": Section(fields={"schedule": choice(*SCHEDULES), "microbatches": integer(1)}),
        "placement": Section(
            fields={
                "devices": optional(list_of(string, 1)),
                "fallback": choice(*FALLBACKS),
                "memory_limit_mb": optional(int_or_list(1)),
                "reserve_mb": integer(0),
                "memory_growth": boolean,
                "visible": optional(list_of(integer(0), 1)),
                "log_device_placement": boolean,
                "replicas": optional(integer(1)),
            }
        ),
        "checkpoint": Section(fields={"every": integer(0), "keep": integer(1), "export": boolean}),
    }
)


def _merge(base: dict, override: dict) -> dict:
    out = dict(base)
    for k, v in override.items():
        out[k] = _merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def resolve_stages(stages: Any, template: dict, group_defaults: Callable[[str, str], dict]) -> list[dict]:
    """Expand `stages` (None, N, or a list of per-stage overrides) into N stage specs.

    A per-stage `model: conv` (a bare name) starts that stage from the packaged
    `model/conv.yaml` instead of the template's model; likewise for `optim`.
    """
    if stages is None:
        stages = 2
    if _is_int(stages):
        if stages < 1:
            raise ConfigError(f"stages={stages} must be a positive integer (or a list of per-stage overrides)")
        return [STAGE("stage", dict(template)) for _ in range(stages)]
    if not isinstance(stages, (list, tuple)) or not stages:
        raise ConfigError(f"stages={stages!r} must be a positive integer or a non-empty list of per-stage overrides, e.g. +stages=3")
    specs = []
    for i, over in enumerate(stages):
        key = f"stages[{i}]"
        if over is None:
            over = {}
        if not isinstance(over, dict):
            raise ConfigError(f"{key}={over!r} must be a mapping of overrides, e.g. {{model: {{width: 32}}}}")
        unknown = sorted(set(over) - set(template))
        if unknown:
            raise ConfigError(f"unknown key {key}.{unknown[0]}; allowed keys of a stage: {', '.join(sorted(template))}")
        spec = _merge(template, {k: v for k, v in over.items() if k not in ("model", "optim")})
        for group in ("model", "optim"):
            value = over.get(group, {})
            if isinstance(value, str):  # `model: conv`: that group's packaged defaults
                base, value = group_defaults(group, value), {}
            elif isinstance(value, dict) and value.get("name", template[group]["name"]) != template[group]["name"]:
                base = group_defaults(group, value["name"])
            else:
                base = template[group]
            spec[group] = _merge(base, value) if isinstance(value, dict) else value
        specs.append(STAGE(key, spec))
    return specs


def validate(cfg: DictConfig, group_defaults: Callable[[str, str], dict]) -> dict:
    """Check the composed config; return it as a plain dict with `stages` expanded."""
    try:
        raw = OmegaConf.to_container(cfg, resolve=True)
    except Exception as e:  # an interpolation that does not resolve
        raise ConfigError(f"config does not resolve: {e}".splitlines()[0]) from None
    raw.pop("hydra", None)
    stages = raw.pop("stages", None)  # already plain: to_container converted it
    checked = ROOT("", raw)
    checked["stages"] = resolve_stages(stages, checked["stage"], group_defaults)
    devices = checked["placement"]["devices"]
    if devices is not None and len(devices) != len(checked["stages"]):
        raise ConfigError(
            f"placement.devices has {len(devices)} entries, but there are {len(checked['stages'])} stages; "
            "give one device per stage"
        )
    if checked["mode"] == "e2e":
        check_microbatches(checked["pipeline"]["microbatches"], checked["data"]["batch_size"])
    return checked


def check_microbatches(microbatches: int, batch_size: int) -> None:
    """mode=e2e cuts every batch into equal microbatches: M must divide the batch size."""
    if batch_size % microbatches:
        divisors = [d for d in range(1, batch_size + 1) if batch_size % d == 0]
        shown = ", ".join(map(str, divisors[:8])) + (", ..." if len(divisors) > 8 else "")
        raise ConfigError(
            f"pipeline.microbatches={microbatches} does not divide data.batch_size={batch_size}; "
            f"microbatches must be equal: use a divisor of {batch_size} ({shown}) or change data.batch_size"
        )
