"""What an `.npz` stream reads (`data=npz data.stream=true`): `ArrayFiles` and its `ArrayPart`s, made by
`npz_data.shards` without TensorFlow and read by `npz_stream`; ragged ids (`data.offsets`): `RaggedFiles`
and its `RaggedPart`s, made by `npz_ragged_parts` and read by `npz_ragged`."""

from __future__ import annotations

from dataclasses import dataclass

from chain.data.sources.npz.npz_members import Member
from chain.data.streamed import TRAIN, VAL


@dataclass(frozen=True)
class ArrayPart:
    """Rows `start`..`stop` of an `.npz` file's arrays read in place: the inputs `x` and each target
    (in the targets' order), every one an `npz_members.Member` of one file."""

    x: Member
    ys: tuple[Member, ...]
    start: int
    stop: int

    @property
    def rows(self) -> int:
        return self.stop - self.start


class NpzParts:
    """What the records of an `.npz` stream share (`ArrayFiles`, `RaggedFiles`): their training part
    `train` and validation part `val` (None: none) counted, and the files they are read from."""

    train: ArrayPart
    val: ArrayPart | None

    @property
    def examples(self) -> int:
        return self.train.rows

    @property
    def val_examples(self) -> int:
        return self.val.rows if self.val else 0

    def files_read(self) -> list[tuple[str, str, str]]:
        """The `.npz` files, training first (`Streamed.files_read`)."""
        out = [(self.train.x.path, "data.path", TRAIN)]
        if self.val is not None and self.val.x.path != self.train.x.path:  # data.val_path
            out.append((self.val.x.path, "data.val_path", VAL))
        return out


@dataclass(frozen=True)
class ArrayFiles(NpzParts):
    """An `.npz` data set streamed (`data=npz data.stream=true`): the training rows (`train`), the
    validation rows (`val`, None: none), the targets as (name, classes: 0 for a value), the rows
    read as one block (`block`: blocks are what is shuffled per epoch and read several at a time)
    and the shuffle buffer in examples."""

    train: ArrayPart
    val: ArrayPart | None
    targets: tuple[tuple[str, int], ...]
    block: int
    shuffle_buffer: int


@dataclass(frozen=True)
class RaggedPart(ArrayPart):
    """Examples `start`..`stop` of an `.npz` file's ragged ids read in place (`data.offsets`): `x` the ids
    of every example one after the other, `offsets` (N + 1) where each example starts (example i is
    `x[offsets[i]:offsets[i + 1]]`), each target (in the targets' order) one label per example (N,) or
    one per id (as `x`, `RaggedFiles.per_id`)."""

    offsets: Member


@dataclass(frozen=True)
class RaggedFiles(NpzParts):
    """An `.npz` file's ragged ids streamed in length buckets (`data=npz data.offsets=KEY`): the training
    and validation examples (`val` None: none), the targets as (name, classes: 0 for a value), whether
    each is a label per id (`per_id`) rather than per example, the length `buckets` (the last: the
    longest an example is read, longer ones cut) and the shuffle buffer in examples."""

    train: RaggedPart
    val: RaggedPart | None
    targets: tuple[tuple[str, int], ...]
    per_id: tuple[bool, ...]
    buckets: tuple[int, ...]
    shuffle_buffer: int
