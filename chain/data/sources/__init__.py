"""The data sources: one module (a built-in set: `digits_data`, `synthetic_data`) or one folder per
source (`csv`, `npz`, `tfrecord`, `tokens`, `text`, `function`, `keras`: its settings, description
and reader, its files read with NumPy, and, for a source that streams, its record and its `tf.data`
stream), each giving `SOURCE = chain.data.data_source.Source(settings, describe, read)`.

`SOURCES` maps every `data.name` to its source, collected from the modules and folders of this
package (so adding a source is one module or folder here plus its `conf/data/NAME.yaml`); the config's schema takes the
`data` section's forms from it (`settings_classes`), and `describe` and the loader
(`chain.data.loader.load`) go through it. No TensorFlow is imported here: a source that needs it
imports it in its reader.
"""

from __future__ import annotations

import importlib
import pkgutil

from chain.data.catalog import DataInfo
from chain.data.data_source import Read, Source


def collect(package: str, path: list[str]) -> dict[str, Source]:
    """`data.name` -> `Source`, from every module and subpackage of the package `package` (its
    `__path__`: `path`); each must define `SOURCE`, and no two may claim one name."""
    found: dict[str, Source] = {}
    for module in sorted(m.name for m in pkgutil.iter_modules(path)):
        source = getattr(importlib.import_module(f"{package}.{module}"), "SOURCE", None)
        if not isinstance(source, Source):
            raise TypeError(f"{package}.{module} defines no SOURCE = Source(settings, describe, read)")
        for kind in source.kinds:
            if kind in found:
                raise TypeError(f"data.name={kind} is claimed by two sources ({package}.{module} and another)")
            found[kind] = source
    return found


SOURCES: dict[str, Source] = collect(__name__, __path__)


def settings_classes() -> tuple[type, ...]:
    """Every source's settings dataclass, once each (the forms of the config's `data` section)."""
    return tuple(dict.fromkeys(s.settings for s in SOURCES.values()))


def describe(data) -> DataInfo | None:
    """The `DataInfo` of a validated `data` section, or None for data only TensorFlow can read
    (described from its arrays when `chain.data.loader.load` reads it)."""
    return SOURCES[data.name].describe(data)


def read(data, seed: int, info: DataInfo | None) -> Read:
    """The arrays of the data set named by a validated `data` section, as its source reads them."""
    return SOURCES[data.name].read(data, seed, info)
