"""What a stream of the user's dataset reads (`data=callable data.stream=true`): `FunctionData`,
made by `function_stream.plan` and read by `function_stream`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from chain.data.catalog import DataInfo


@dataclass(frozen=True)
class FunctionData:
    """The user's `tf.data.Dataset` streamed as it is (`data=callable data.stream=true`): the dataset
    of single examples (`dataset`, a `tf.data.Dataset`), its target names in order (None: a bare y),
    the description (`info`: shapes from its element spec, classes from `data.classes`, size from
    `data.examples` or a count), the first `held` examples kept for validation, the shuffle buffer,
    and what names it in error lines (`what`)."""

    dataset: Any
    names: tuple[str | None, ...]
    info: DataInfo
    held: int
    shuffle_buffer: int
    what: str
