"""An `.npz` file's arrays read with NumPy alone (no TensorFlow): one array's shape and dtype from
its header (`npz_shape`, `npz_header`), one array whole (`npz_array`), and where an uncompressed
member's data lies in the file (`npz_member`, for streaming it). A missing key or a damaged file
(a bad CRC, magic number or deflate stream) is one `ConfigError` line naming the key and the file."""

from __future__ import annotations

import math
import os
import struct
import zipfile
import zlib
from dataclasses import dataclass

import numpy as np

from chain.data.paths import existing
from chain.errors import ConfigError, first_line


def _npz_keys(path: str, key: str) -> list[str]:
    try:
        with zipfile.ZipFile(path) as z:
            return [n[: -len(".npy")] for n in z.namelist() if n.endswith(".npy")]
    except (zipfile.BadZipFile, OSError) as e:
        raise ConfigError(f"{key}={path!r} is not a readable .npz file ({e})") from None


def _member(path: str, array: str, key: str, path_key: str) -> str:
    keys = _npz_keys(path, path_key)
    if array not in keys:
        raise ConfigError(f"{key}={array!r} is not an array of {path}; its arrays: {', '.join(keys) or 'none'}")
    return f"{array}.npy"


# What a damaged `.npz` raises while a member is read: a bad header magic or CRC-32
# (BadZipFile), a broken deflate stream (zlib.error), a member cut short (EOFError, OSError).
_DAMAGE = (zipfile.BadZipFile, zlib.error, EOFError, OSError)


def _damaged(path: str, path_key: str, member: str, e: BaseException) -> ConfigError:
    return ConfigError(f"{path_key}={path!r} is damaged ({member}: {first_line(e, typed=False)}); write it again")


def npz_header(path: str, array: str, key: str, path_key: str) -> tuple[tuple[int, ...], np.dtype]:
    """The shape and dtype of `array` in the `.npz` file `path`, read from its header (`key` names it in errors)."""
    member = _member(existing(path, path_key), array, key, path_key)
    try:
        with zipfile.ZipFile(path) as z, z.open(member) as f:
            version = np.lib.format.read_magic(f)
            read = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
            shape, _, dtype = read(f)
    except _DAMAGE as e:
        raise _damaged(path, path_key, member, e) from None
    except ValueError as e:  # not a .npy header
        raise _damaged(path, path_key, member, e) from None
    return tuple(shape), np.dtype(dtype)


def npz_shape(path: str, array: str, key: str, path_key: str) -> tuple[int, ...]:
    """The shape of `array` in the `.npz` file `path`, read from its header (`key` names it in errors)."""
    return npz_header(path, array, key, path_key)[0]


def npz_array(path: str, array: str, key: str, path_key: str) -> np.ndarray:
    """`array` of the `.npz` file `path` (no pickled objects); a damaged file is one line naming it."""
    member = _member(existing(path, path_key), array, key, path_key)
    try:
        with np.load(path, allow_pickle=False) as f:
            return f[array]
    except _DAMAGE as e:
        raise _damaged(path, path_key, member, e) from None
    except ValueError as e:
        if "allow_pickle" in str(e):  # an object array
            raise ConfigError(f"{key}={array!r} in {path} cannot be read without pickle ({e}); save numbers") from None
        raise _damaged(path, path_key, member, e) from None


@dataclass(frozen=True)
class Member:
    """Where an array of an uncompressed `.npz` file lies in the file: its data starts at byte
    `offset` and holds `shape` (C order) of `dtype` (NumPy's string, e.g. '<f4'); `size` is the
    file's size in bytes."""

    path: str
    offset: int
    shape: tuple[int, ...]
    dtype: str
    size: int

    @property
    def row_bytes(self) -> int:
        """Bytes of one example (one row along the first axis)."""
        return np.dtype(self.dtype).itemsize * math.prod(self.shape[1:])


_LOCAL_HEADER = 30  # a zip member's local header, before its file name and extra field


def npz_member(path: str, array: str, key: str, path_key: str) -> Member:
    """Where `array` of the `.npz` file `path` lies (its `.npy` header read, not its data); one line
    naming `path_key` when the member is compressed (`np.savez_compressed`), stored in Fortran order,
    or not of plain numbers: only an uncompressed C-order member can be read in place."""
    member = _member(existing(path, path_key), array, key, path_key)
    try:
        with zipfile.ZipFile(path) as z:
            info = z.getinfo(member)
        if info.compress_type != zipfile.ZIP_STORED:
            raise ConfigError(
                f"{path_key}={path!r} is compressed (np.savez_compressed): data.stream=true reads its "
                "arrays in place, which needs them stored as they are; save it with np.savez, or give "
                "data.stream=false"
            )
        with open(path, "rb") as f:
            f.seek(info.header_offset)
            head = f.read(_LOCAL_HEADER)
            if len(head) < _LOCAL_HEADER or head[:4] != b"PK\x03\x04":
                raise zipfile.BadZipFile(f"no local header for {member}")
            names, extra = struct.unpack("<HH", head[26:30])
            f.seek(info.header_offset + _LOCAL_HEADER + names + extra)
            version = np.lib.format.read_magic(f)
            read = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
            shape, fortran, dtype = read(f)
            offset = f.tell()
    except _DAMAGE as e:
        raise _damaged(path, path_key, member, e) from None
    except ValueError as e:  # not a .npy header
        raise _damaged(path, path_key, member, e) from None
    if fortran and len(shape) > 1:
        raise ConfigError(
            f"{key}={array!r} of {path} is stored in Fortran order; data.stream=true reads one example "
            "per row: save np.ascontiguousarray of it"
        )
    if dtype.kind not in "iufb" or dtype.fields is not None:
        raise ConfigError(
            f"{key}={array!r} of {path} holds {dtype}; data.stream=true reads numbers (int, uint, float, bool)"
        )
    end = offset + dtype.itemsize * math.prod(shape)
    if end > os.path.getsize(path):
        raise _damaged(path, path_key, member, EOFError("the array's data is cut short"))
    return Member(path, offset, tuple(shape), dtype.str, os.path.getsize(path))
