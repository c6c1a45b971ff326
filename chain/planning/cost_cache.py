"""`placement.plan=auto`'s cache of measurements: RUN_DIR/plan_costs.json holds the `Costs` a run measured,
the `CostKey` of everything they depend on and the run that measured them (`CostFile`). A later run in the
directory reads them only when its own key is the same (a resume); otherwise it measures again, and the
planning line says which of the two happened, with whose measurements (`CacheUse`, `chain.planning.plan_table`).

The key is made once per run from typed records (`chain.training.planned.cost_key`); comparing it names what
differs in words a user knows (the model, the batch, the devices, ...). Written by `chain.training.planned`
(atomically, `chain.state.atomic`). No TensorFlow.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass, fields

from chain.records.auto_plan import CacheUse
from chain.planning.search import Costs
from chain.records import serial
from chain.records.serial import item

NAME = "plan_costs.json"


@dataclass(frozen=True)
class CostKey:
    """Everything plan=auto's measurements depend on: two runs with equal keys would measure the same."""

    model: str = item(
        "a digest of the model's structure and its weights' shapes (a cut model's layers, their "
        "configurations, outputs and cuts; a built-in model's stages as the config gives them)"
    )
    input_shape: tuple[int, ...] = item("the shape of one example")
    batch_size: int = item("data.batch_size: the global batch the plans cut")
    sizes: tuple[int, ...] = item("the microbatch sizes measured (every size a candidate may run)")
    devices: tuple[str, ...] = item("the pool of devices the plans draw from")
    physical: tuple[str, ...] = item("the physical device behind each of `devices`")
    settings: str = item("the settings the measuring reads: the optimizer, placement.plan_budget_s")
    tensorflow: str = item("TensorFlow's version")
    keras: str = item("Keras' version")
    chain: str = item("chain's version")

    @property
    def digest(self) -> str:
        """Twelve hex digits naming the key (in log lines)."""
        return digest(serial.to_json(self))[:12]


@dataclass(frozen=True)
class CostFile:
    """RUN_DIR/plan_costs.json: the measurements, their key, and the run that measured them."""

    key: CostKey | None = item("what the measurements depend on (None: a file written before keys)", default=None)
    measured_by: str | None = item("the run that measured them: when, its process and its model", default=None)
    costs: Costs | None = item("the measurements", default=None)


def digest(value: object) -> str:
    """A SHA-256 of `value` as JSON (keys sorted; a value JSON does not know by its `str`)."""
    return hashlib.sha256(json.dumps(value, sort_keys=True, default=str).encode()).hexdigest()


# what a user calls each part of the key, in the order a line names them
_WORDS = {
    "model": "model",
    "input_shape": "model",
    "batch_size": "batch",
    "sizes": "batch",
    "devices": "devices",
    "physical": "devices",
    "settings": "settings",
    "tensorflow": "versions",
    "keras": "versions",
    "chain": "versions",
}


def differences(a: CostKey, b: CostKey) -> tuple[str, ...]:
    """What of two keys differs, in words (`model`, `batch`, `devices`, `settings`, `versions`), each once."""
    out = [_WORDS[f.name] for f in fields(CostKey) if _plain(getattr(a, f.name)) != _plain(getattr(b, f.name))]
    return tuple(dict.fromkeys(out))


def _plain(value: object) -> object:
    """`value` with its tuples as lists, as a key read back from JSON holds them."""
    return [_plain(v) for v in value] if isinstance(value, (list, tuple)) else value


def read(path: str) -> CostFile | None:
    """The cache at `path` (None: no file); a damaged or unreadable one, or one of an earlier version (bare
    `Costs`), reads as a `CostFile` of nothing."""
    if not os.path.isfile(path):
        return None
    try:
        with open(path) as f:
            return serial.from_json(CostFile, json.load(f))
    except (OSError, ValueError):  # unreadable or damaged (json's and serial's errors are ValueErrors)
        return CostFile()


def lookup(found: CostFile | None, key: CostKey) -> tuple[Costs | None, CacheUse | None]:
    """The cached costs `key` may use (None: measure) and what was found (None: no cache)."""
    if found is None:
        return None, None
    if found.key is None or found.costs is None:  # damaged, or written by a version without keys
        return None, CacheUse(key.digest, found.measured_by, ("file",))
    differ = differences(found.key, key)
    return (None if differ else found.costs), CacheUse(key.digest, found.measured_by, differ, found.key.digest)
