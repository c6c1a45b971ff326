"""TFRecord files read without TensorFlow: a record at its place in a file, its checksums, and
what a `tf.train.Example` record holds (each feature's kind and number of values, from the
protobuf wire format). No TensorFlow: the preparation pass uses it before TensorFlow starts.

`first_record` and `example_features` are how `data=tfrecord` refuses, before training, a file
whose examples are not shaped as `data.features` declares (another shape or type than the other
files'): its first record is read and compared, one record a file (a stream checks the records
past the first as it reads them, `tfrecord_stream`). `whole_records` counts a file's
records from their framing (a stream's and a load's count), refusing a file cut short. `damaged` finds which record of a
file a failed checksum is in: TensorFlow's reader says only `corrupted record at N`, a byte offset.

A record is framed as TensorFlow writes it: its length (uint64, little-endian), the masked
CRC-32C of those 8 bytes, the data, the masked CRC-32C of the data.
"""

from __future__ import annotations

import os
import struct

from chain.errors import ConfigError

HEAD = 12  # the length and its checksum
FOOT = 4  # the data's checksum

_TABLE = []
for _n in range(256):  # CRC-32C (Castagnoli), reflected polynomial 0x82F63B78
    for _ in range(8):
        _n = (_n >> 1) ^ 0x82F63B78 if _n & 1 else _n >> 1
    _TABLE.append(_n)


def masked_crc(data: bytes) -> int:
    """The masked CRC-32C of `data`, as a TFRecord file stores it (pure Python: for a record or two
    on an error's path, never for a whole file)."""
    crc = 0xFFFFFFFF
    for b in data:
        crc = _TABLE[(crc ^ b) & 0xFF] ^ (crc >> 8)
    crc ^= 0xFFFFFFFF
    return ((((crc >> 15) | (crc << 17)) & 0xFFFFFFFF) + 0xA282EAD8) & 0xFFFFFFFF


def damaged(path: str, offset: int) -> int | None:
    """The number (0-based) of the record of `path` whose checksum TensorFlow reported failing at
    byte `offset` (the record's start: its length's checksum; 12 bytes in: its data's), if one
    of its records sits there and fails it; else None."""
    try:
        with open(path, "rb") as f:
            at, n = 0, 0
            while at <= offset:
                f.seek(at)
                head = f.read(HEAD)
                if len(head) < HEAD:
                    return None
                (length,), (crc,) = struct.unpack("<Q", head[:8]), struct.unpack("<I", head[8:])
                if at == offset:
                    return n if masked_crc(head[:8]) != crc else None
                if at + HEAD == offset:
                    data, foot = f.read(length), f.read(FOOT)
                    return n if len(foot) == FOOT and masked_crc(data) != struct.unpack("<I", foot)[0] else None
                at, n = at + HEAD + length + FOOT, n + 1
    except OSError:
        return None
    return None


def whole_records(path: str, where: str) -> int:
    """The number of records of the uncompressed TFRecord file `path`, counted from their framing;
    one line (naming `where`, the key and its glob) when the file ends inside a record: TensorFlow's
    reader takes a file cut inside a record's header for its end, and reads the records before
    it without a word."""
    size, at, n = os.path.getsize(path), 0, 0
    with open(path, "rb") as f:
        while at < size:
            head = f.read(HEAD)
            end = at + HEAD + FOOT + struct.unpack("<Q", head[:8])[0] if len(head) == HEAD else size + 1
            if end > size:
                raise ConfigError(
                    f"{where}: {path} ends inside record {n} ({n} whole records before it): the file is "
                    "cut short, or that record's length is damaged"
                )
            f.seek(end)
            at, n = end, n + 1
    return n


def first_record(path: str) -> bytes | None:
    """The data of the first record of `path`, or None when it holds no whole record."""
    with open(path, "rb") as f:
        head = f.read(HEAD)
        if len(head) < HEAD:
            return None
        length = struct.unpack("<Q", head[:8])[0]
        if length > os.fstat(f.fileno()).st_size - HEAD:  # not a record's length (never read 2**60 bytes)
            return None
        data = f.read(length)
    return data if len(data) == length else None


def _varint(b: bytes, i: int) -> tuple[int, int]:
    n = shift = 0
    while True:
        c = b[i]
        i += 1
        n |= (c & 0x7F) << shift
        if c < 0x80:
            return n, i
        shift += 7


def _fields(b: bytes):
    """(field number, wire type, value) of each field of a protobuf message: an int for a varint,
    the bytes otherwise. ValueError or IndexError when `b` is not a message."""
    i = 0
    while i < len(b):
        key, i = _varint(b, i)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, i = _varint(b, i)
        elif wire in (1, 5):
            size = 8 if wire == 1 else 4
            value, i = b[i : i + size], i + size
        elif wire == 2:
            size, i = _varint(b, i)
            value, i = b[i : i + size], i + size
        else:
            raise ValueError(f"wire type {wire}")
        if i > len(b):
            raise ValueError("a field runs past the message")
        yield number, wire, value


KINDS = {1: "bytes", 2: "float32", 3: "int64"}  # tf.train.Feature's oneof: bytes_list, float_list, int64_list


def _values(kind: int, message: bytes) -> int:
    """How many values a BytesList, FloatList or Int64List holds (packed or not)."""
    n = 0
    for number, wire, value in _fields(message):
        if number != 1:
            continue
        if wire == 2 and kind == 2:  # packed floats
            n += len(value) // 4
        elif wire == 2 and kind == 3:  # packed varints: one ends at each byte below 0x80
            n += sum(1 for c in value if c < 0x80)
        else:
            n += 1
    return n


def example_features(record: bytes) -> dict[str, tuple[str, int]]:
    """name -> (kind: `float32`, `int64` or `bytes`; number of values) of each feature of the
    serialized `tf.train.Example` `record`; ValueError when it is not one."""
    out: dict[str, tuple[str, int]] = {}
    try:
        for number, wire, features in _fields(record):
            if number != 1 or wire != 2:  # Example.features
                continue
            for number, wire, entry in _fields(features):
                if number != 1 or wire != 2:  # Features.feature, a map entry
                    continue
                name, value = "", b""
                for k, w, v in _fields(entry):
                    if k == 1 and w == 2:
                        name = v.decode("utf-8")
                    elif k == 2 and w == 2:
                        value = v
                kind = None
                for k, w, v in _fields(value):
                    if k in KINDS and w == 2:
                        kind, out[name] = k, (KINDS[k], _values(k, v))
                if kind is None:
                    out[name] = ("", 0)  # a feature with no list holds nothing
    except (IndexError, UnicodeDecodeError) as e:
        raise ValueError(str(e)) from None
    return out
