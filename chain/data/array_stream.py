"""The `tf.data` stream of an `.npz` file's arrays read in place (`data=npz data.stream=true`,
`chain.data.streamed.ArrayFiles`), never gathered into NumPy.

An uncompressed `.npz` member is a `.npy` file inside the zip: a header, then the array's bytes
in C order, so example i of an array is `row_bytes` bytes at `offset + i x row_bytes`.
`tf.data.FixedLengthRecordDataset` reads those records (one per example) from a byte range of the
file and `tf.io.decode_raw` turns a chunk of them into numbers; the inputs and each target are read
as parallel record streams, zipped. Every stage is TensorFlow's own and checkpointable (no Python
generator, no `py_function`), so a resumed run sees the batches it would have seen.

Shuffling: the training rows are cut into blocks of `block` consecutive examples; every epoch the
blocks' order is shuffled from `seed`, four blocks are read at a time (`interleave`, a chunk of up
to 256 examples of each in turn) and the examples shuffled in a buffer of `shuffle_buffer`. An example therefore
moves anywhere at the scale of blocks and locally within the buffer, and every example is read
exactly once an epoch (the stream is repeated after it is shuffled).
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from chain.data.files import Member
from chain.data.streamed import ArrayFiles, ArrayPart

CYCLE = 4  # blocks read at a time
CHUNK = 256  # records decoded in one op


def _dtype(member: Member) -> tuple[tf.DType, bool]:
    """TensorFlow's dtype of `member`'s numbers (bool read as uint8) and whether they are little-endian."""
    dt = np.dtype(member.dtype)
    name = "uint8" if dt.kind == "b" else dt.newbyteorder("=").name
    return tf.as_dtype(name), dt.byteorder != ">"


def _rows(member: Member, start, stop) -> tf.data.Dataset:
    """Rows `start`..`stop` (int64 tensors) of `member`, one record of bytes each."""
    rb = member.row_bytes
    return tf.data.FixedLengthRecordDataset(member.path, rb, header_bytes=member.offset + start * rb,
                                            footer_bytes=member.size - member.offset - stop * rb)


def _decode(member: Member, out: tf.DType, scalar: bool):
    dtype, little = _dtype(member)
    shape = list(member.shape[1:])

    def decode(records):
        values = tf.reshape(tf.io.decode_raw(records, dtype, little_endian=little), [-1, *shape])
        return tf.cast(tf.reshape(values, [-1]) if scalar else values, out)

    return decode


def _block(files: ArrayFiles, part: ArrayPart):
    """Row `start` -> the examples of the block that starts there, decoded in chunks."""
    decoders = [_decode(part.x, tf.float32, False)] + [
        _decode(m, tf.int32 if classes else tf.float32, True) for m, (_, classes) in zip(part.ys, files.targets)]
    names = [name for name, _ in files.targets]

    def block(start):
        stop = tf.minimum(start + files.block, part.stop)
        chunks = tf.data.Dataset.zip(tuple(_rows(m, start, stop) for m in (part.x, *part.ys))).batch(CHUNK)
        return chunks.map(lambda *records: (decoders[0](records[0]),
                                            {n: d(r) for n, d, r in zip(names, decoders[1:], records[1:])}))

    return block


def training(files: ArrayFiles, batch: int, shuffle: bool, seed: int) -> tf.data.Dataset:
    """The endless stream of `(x, {target: y})` batches of `batch` examples (see the module)."""
    part = files.train
    blocks = tf.data.Dataset.range(part.start, part.stop, files.block)
    count = -(-part.rows // files.block)
    if shuffle:
        blocks = blocks.shuffle(count, seed=seed, reshuffle_each_iteration=True)
    examples = blocks.interleave(_block(files, part), cycle_length=min(CYCLE, count), block_length=1,
                                 num_parallel_calls=tf.data.AUTOTUNE, deterministic=True).unbatch()
    if shuffle:
        examples = examples.shuffle(files.shuffle_buffer, seed=seed, reshuffle_each_iteration=True)
    # repeated last: every example exactly once an epoch (the shuffles drawn again each epoch)
    return examples.repeat().batch(batch, drop_remainder=True).prefetch(tf.data.AUTOTUNE)


def validation(files: ArrayFiles, batch: int) -> tf.data.Dataset | None:
    """The validation rows once, in order, in batches of at most `batch`; None without any."""
    part = files.val
    if part is None or not part.rows:
        return None
    whole = _block(ArrayFiles(part, None, files.targets, part.rows, 1), part)
    return whole(tf.constant(part.start, tf.int64)).unbatch().batch(batch).prefetch(tf.data.AUTOTUNE)
