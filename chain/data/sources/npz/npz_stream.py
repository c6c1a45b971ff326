"""The `tf.data` stream of an `.npz` file's arrays read in place (`data=npz data.stream=true`,
`npz_record.ArrayFiles`), never gathered into NumPy.

An uncompressed `.npz` member is a `.npy` file inside the zip: a header, then the array's bytes
in C order, so rows i..j of an array are the bytes from `offset + i x row_bytes` to
`offset + j x row_bytes`. `tf.data.FixedLengthRecordDataset` reads a chunk of rows as one record
(`chain.data.chunks.chunk_rows`: up to 256 rows, 64 KB) from a byte range of the file and
`tf.io.decode_raw` turns it into numbers; the inputs and each target are read as parallel streams
of chunks, zipped. Every stage is TensorFlow's own and checkpointable (no Python generator, no
`py_function`), so a resumed run sees the batches it would have seen. No stage handles one example
at a time: reading a record per example and shuffling one example at a time made this stream 0.3x
as fast as the in-memory one, and the default model train at 0.7x its in-memory speed.

Shuffling: the training rows are cut into blocks of `block` consecutive examples; every epoch the
blocks' order is shuffled from `seed`, four blocks are read at a time (`interleave`, a chunk of
each in turn), and the chunks are shuffled and permuted in groups of `shuffle_buffer` examples
(`chain.data.chunks.epochs`). An example therefore moves anywhere at the scale of blocks and within its
group, and every example is read exactly once an epoch (the stream is repeated after the groups
are cut; a group never holds two epochs).
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from chain.data.catalog import label_shape
from chain.data.chunks import CHUNK_BYTES, chunk_rows, epochs, interleaved, shuffled
from chain.data.sources.npz.npz_members import Member
from chain.data.sources.npz.npz_record import ArrayFiles, ArrayPart
from chain.data.verify import input_dtype


def _dtype(member: Member) -> tuple[tf.DType, bool]:
    """TensorFlow's dtype of `member`'s numbers (bool read as uint8) and whether they are little-endian."""
    dt = np.dtype(member.dtype)
    name = "uint8" if dt.kind == "b" else dt.newbyteorder("=").name
    return tf.as_dtype(name), dt.byteorder != ">"


def _chunks(member: Member, start, stop, chunk: int) -> tf.data.Dataset:
    """Rows `start`..`stop` (int64 tensors) of `member` as records of the bytes of `chunk` rows each,
    the last record the rows left (none when there are none)."""
    rb = member.row_bytes
    whole = start + (stop - start) // chunk * chunk

    def rows(first, last, per_record):
        # A read buffer of one chunk of inputs: the default (256 KB) held per open block doubled the
        # stream's memory. Not less: a target's chunk of a few bytes a row made a read call per 128
        # bytes (a 64 MB epoch took 40 s of system time instead of 3).
        return tf.data.FixedLengthRecordDataset(
            member.path,
            per_record * rb,
            header_bytes=member.offset + first * rb,
            footer_bytes=member.size - member.offset - last * rb,
            buffer_size=max(chunk * rb, CHUNK_BYTES),
        )

    # an empty byte range holds no record, so the rest is nothing when the chunks end at `stop`
    return rows(start, whole, chunk).concatenate(rows(whole, stop, tf.maximum(stop - whole, 1)))


def _decode(member: Member, out: tf.DType, scalar: bool):
    dtype, little = _dtype(member)
    shape = list(member.shape[1:])

    def decode(record):
        values = tf.reshape(tf.io.decode_raw(record, dtype, little_endian=little), [-1, *shape])
        return tf.cast(tf.reshape(values, [-1]) if scalar else values, out)

    return decode


def _block(files: ArrayFiles, part: ArrayPart, chunk: int):
    """Row `start` -> the records of the block that starts there: a tuple of the inputs' and each
    target's bytes of (up to) `chunk` rows."""

    def block(start):
        stop = tf.minimum(start + files.block, part.stop)
        return tf.data.Dataset.zip(tuple(_chunks(m, start, stop, chunk) for m in (part.x, *part.ys)))

    return block


def _decoded(files: ArrayFiles, part: ArrayPart):
    """Records (the inputs' and each target's bytes of a chunk of rows) -> (x, {target: y}). A map
    of its own, not inside each block's dataset: a function in the dataset that `interleave` makes
    per block is instantiated again per block (about 2 ms of CPU each, measured)."""
    x_dtype = tf.as_dtype(input_dtype(part.x.dtype))  # integers stay integers
    decoders = [_decode(part.x, x_dtype, False)] + [
        _decode(m, tf.int32 if classes else tf.float32, not label_shape(m.shape[1:]))  # labels per position kept
        for m, (_, classes) in zip(part.ys, files.targets)
    ]
    names = [name for name, _ in files.targets]
    return lambda *records: (decoders[0](records[0]), {n: d(r) for n, d, r in zip(names, decoders[1:], records[1:])})


def training(files: ArrayFiles, batch: int, shuffle: bool, seed: int) -> tf.data.Dataset:
    """The endless stream of `(x, {target: y})` batches of `batch` examples (see the module)."""
    part = files.train
    chunk = chunk_rows(part.x.row_bytes)
    count = -(-part.rows // files.block)
    blocks = shuffled(tf.data.Dataset.range(part.start, part.stop, files.block), count, shuffle, seed)
    chunks = interleaved(blocks, _block(files, part, chunk), count).map(_decoded(files, part))
    return epochs(chunks, batch, files.shuffle_buffer, chunk, shuffle, seed)


def validation(files: ArrayFiles, batch: int) -> tf.data.Dataset | None:
    """The validation rows once, in order, in batches of at most `batch`; None without any."""
    part = files.val
    if part is None or not part.rows:
        return None
    whole = ArrayFiles(part, None, files.targets, part.rows, 1)
    chunks = _block(whole, part, chunk_rows(part.x.row_bytes))(tf.constant(part.start, tf.int64))
    return chunks.map(_decoded(whole, part)).rebatch(batch).prefetch(tf.data.AUTOTUNE)
