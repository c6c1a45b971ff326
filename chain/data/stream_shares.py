"""Replicas reading their own shares of a streamed data set (`data.stream=true` with
`placement.fallback=mirrored`, in one process or across hosts).

Replica r of R reads only its own training files, `paths[r::R]` in sorted order (a fixed deal:
`tfrecord_stream.replica_files` of `chain.data.sources.tfrecord`), as a stream of a data set of just those files would:
shuffled per epoch from `seed`, its examples shuffled in its own buffer of `data.shuffle_buffer`,
in batches of its share of the step (`examples_per_step / R`). A process's batch is its replicas'
batches one after the other in replica order; the mirrored step cuts a batch into contiguous
parts, one per replica, so each replica trains on the examples its own stream read. One process
holding every replica and each host holding only its own replicas' streams thus train on the
same examples per replica. No TensorFlow here.
"""

from __future__ import annotations

from dataclasses import dataclass

from chain.data.streamed import Streamed
from chain.errors import ConfigError


@dataclass(frozen=True)
class StreamShares:
    """The replicas whose streams this process reads: `count` replicas from `first` on, of `replicas`
    in the run (one process: all of them; one host of several: its own, numbered as the run numbers them)."""

    first: int
    count: int
    replicas: int

    @property
    def indices(self) -> range:
        """The run-wide numbers of this process's replicas, in order."""
        return range(self.first, self.first + self.count)


def check_files(shards: Streamed, replicas: int, files: str | None) -> None:
    """One ConfigError line when the replicas cannot read shares of this stream: not TFRecord files
    (the only stream read in shares so far), or fewer training files than the run's `replicas`
    (a replica would have no file of its own; `files` is data.path's glob)."""
    if not shards.SHARES:
        raise ConfigError(
            f"data.stream=true with {replicas} mirrored replicas: each replica reads files of its own, "
            "which only data=tfrecord streams do so far: use data=tfrecord, data.stream=false, or one "
            "replica (placement.replicas=1)"
        )
    if len(shards.paths) < replicas:
        held = (
            " (after the files data.val_fraction holds out)"
            if shards.val_key == "data.path" and shards.val_paths
            else ""
        )
        raise ConfigError(
            f"data.path={files!r} gives {len(shards.paths)} training file(s){held}, and with "
            f"data.stream=true each of the {replicas} mirrored replicas reads files of its own: "
            f"give data.path at least {replicas} training files, or data.stream=false"
        )
