"""Streams of chunks of examples, shuffled and batched without an op per example: what the
TFRecord, CSV and `.npz` streams (`tfrecord_stream`, `csv_stream`, `npz_stream` of `chain.data.sources`) share
once they have read a chunk.

A per-example `unbatch`, `shuffle` and `batch` made a stream 4 to 10x slower than training on
small examples. Here whole chunks pass a shuffle buffer, are cut into groups of
`data.shuffle_buffer` examples (`rebatch`, no copy per example), each group is permuted by a
stateless shuffle seeded from (`seed`, the group's number in the run), and batches are cut from
the groups by `rebatch`. Deterministic from `seed` and the data, and checkpointable: the groups'
numbering is `enumerate`'s counter, which the iterator's state holds.
"""

from __future__ import annotations

import math
from typing import Callable

import tensorflow as tf

CYCLE = 4  # files (or blocks) read at a time: enough to mix them and keep the reader busy, few open buffers
# Files read and chunks parsed at a time. Not AUTOTUNE: its buffers grow while a consumer pulls
# fast (a group of data.shuffle_buffer examples) and every element they hold is in every checkpoint
# (measured: 14 to 43 MB for the same stream, from one save to the next); the order is the same
# either way (deterministic), and two keep both cores busy.
PARALLEL = 2
CHUNK_BYTES = 1 << 16  # examples read in one op, up to this many input bytes: an op per example would
MAX_CHUNK = 256  # make the stream the bottleneck for small examples, large chunks cost memory
AHEAD = 2  # batches read ahead at least; not AUTOTUNE: its buffer grew from one save to the next (10, 16, 27 MB)


def chunk_rows(row_bytes: int) -> int:
    """Examples read (or parsed) in one op: 256 small ones, fewer large ones (64 KB of inputs at most)."""
    return max(1, min(MAX_CHUNK, CHUNK_BYTES // row_bytes))


def interleaved(sources: tf.data.Dataset, read, count: int) -> tf.data.Dataset:
    """`read(source)` (a dataset of chunks) of `CYCLE` of the `count` sources at a time, a chunk of
    each in turn, `PARALLEL` read in parallel, in a deterministic order."""
    cycle = min(CYCLE, count)
    return sources.interleave(
        read, cycle_length=cycle, block_length=1, num_parallel_calls=min(PARALLEL, cycle), deterministic=True
    )


def grouped(chunks: tf.data.Dataset, buffer: int, chunk: int, seed: int) -> tf.data.Dataset:
    """Chunks of at most `chunk` examples, shuffled whole in a buffer of about `buffer` examples
    and cut into groups of `buffer` examples (the last of a finite stream shorter)."""
    chunks = chunks.shuffle(max(1, math.ceil(buffer / chunk)), seed=seed, reshuffle_each_iteration=True)
    return chunks.rebatch(buffer)


def permuted(groups: tf.data.Dataset, seed: int) -> tf.data.Dataset:
    """Each group (any structure of tensors with the examples along their first axis) permuted by a
    stateless shuffle seeded from (`seed`, the group's number)."""

    def permute(g, group):
        n = tf.shape(tf.nest.flatten(group)[0])[0]
        order = tf.random.experimental.stateless_shuffle(tf.range(n), seed=tf.stack([tf.constant(seed, tf.int64), g]))
        return tf.nest.map_structure(lambda t: tf.gather(t, order), group)

    # Not a parallel map: it would hold several groups read ahead, each in every checkpoint.
    return groups.enumerate().map(permute)


def read_ahead(buffer: int, batch: int) -> int:
    """Batches of `batch` examples read ahead: a group's worth (`buffer` examples, at least `AHEAD`
    batches). The stream's work comes in bursts (a group read and permuted once every
    `buffer / batch` batches); with two batches read ahead a short step waited for that burst (the
    default model: 0.8x the in-memory run's steps/s), with a group's worth the stream makes the
    next group while the steps take the batches read ahead. Every batch read ahead is in every
    checkpoint: about `buffer` examples more."""
    return max(AHEAD, math.ceil(buffer / batch))


def batched(examples: tf.data.Dataset, batch: int, buffer: int) -> tf.data.Dataset:
    """Chunks of examples -> batches of exactly `batch` examples, read ahead (`read_ahead`)."""
    # tf.data's own rewrites would make the sequential maps parallel and add prefetches with
    # autotuned buffers: groups of data.shuffle_buffer examples read ahead, all in every checkpoint.
    options = tf.data.Options()
    options.experimental_optimization.map_parallelization = False
    options.experimental_optimization.inject_prefetch = False
    batches = examples.rebatch(batch, drop_remainder=True)
    return batches.prefetch(read_ahead(buffer, batch)).with_options(options)


def shuffled(sources: tf.data.Dataset, count: int, shuffle: bool, seed: int) -> tf.data.Dataset:
    """The `count` sources (files, or blocks of rows) in a new order each epoch from `seed` (`shuffle`)."""
    return sources.shuffle(count, seed=seed, reshuffle_each_iteration=True) if shuffle else sources


def epochs(
    chunks: tf.data.Dataset,
    batch: int,
    buffer: int,
    chunk: int,
    shuffle: bool,
    seed: int,
    endless: bool = False,
    kept: Callable[[tf.data.Dataset], tf.data.Dataset] | None = None,
) -> tf.data.Dataset:
    """An epoch's chunks of at most `chunk` examples -> the endless stream of batches of `batch`: with
    `shuffle`, the chunks shuffled and grouped (`grouped`, a buffer of `buffer` examples), repeated
    once the groups are cut (every example exactly once an epoch, the shuffles drawn again each epoch,
    the groups numbered across epochs), each group permuted (`permuted`), then `kept` (a stream that
    leaves out bad records), batched and read ahead (`batched`). `endless`: the chunks repeat
    already (their sources were repeated), so they are not repeated here."""
    if shuffle:
        chunks = grouped(chunks, buffer, chunk, seed)
    if not endless:
        chunks = chunks.repeat()
    if shuffle:
        chunks = permuted(chunks, seed)
    if kept is not None:
        chunks = kept(chunks)
    return batched(chunks, batch, buffer)
