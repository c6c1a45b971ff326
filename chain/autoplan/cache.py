"""`placement.plan=auto`'s cache of measurements: RUN_DIR/plan_costs.json holds the `Costs` a run measured,
the `CostKey` of everything they depend on and the run that measured them (`CostFile`). A later run in the
directory reads them only when its own key is the same (a resume); otherwise it measures again, and the
planning line says which of the two happened, with whose measurements (`CacheUse`, `chain.autoplan.table`). The
records are `chain.records.auto_plan`'s.

The key is made once per run from typed records (`chain.autoplan.settle.cost_key`); comparing it names what
differs in words a user knows (the model, the batch, the devices, ...). Written by `chain.autoplan.settle`
(atomically, `chain.state.atomic`). No TensorFlow.
"""

from __future__ import annotations

import json
import os
from dataclasses import fields

from chain.records import serial
from chain.records.auto_plan import CacheUse, CostFile, CostKey, Costs

NAME = "plan_costs.json"


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
