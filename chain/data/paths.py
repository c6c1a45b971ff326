"""Reading the user's files and the Keras cache with NumPy alone (no TensorFlow).

Every problem is one `ConfigError` line that names the config key and the file: a file
that does not exist, a key that is not among an `.npz` file's arrays, a damaged `.npz` (a bad
CRC, magic number or deflate stream), a CSV file not in UTF-8, a header with a blank or repeated
column name, a cell that is not a finite number, a TFRecord file cut short, a Keras data set
missing from the cache.

- `npz_shape`, `npz_array`: one array of an `.npz` file (its shape from the header alone).
- `npz_member`: where an array's data lies inside an uncompressed `.npz` file (for streaming it).
- `csv_table`: a CSV file with a header row, as column names and a float64 matrix (cached,
  since both the config checks and the build read it); `csv_header`, `csv_rows`: a CSV file's
  header and its number of rows, without reading it into memory (for streaming it).
- `keras_home`, `keras_arrays`, `KERAS`: the Keras data sets, read from Keras' own cache
  files; missing files are an error that says how to fill the cache, never a download.
- `keras_model_file`: a `.keras` model file that is whole (not empty, not cut short).
- `matching`: the files of a glob.
"""

from __future__ import annotations

import codecs
import csv
import functools
import glob
import gzip
import io
import math
import os
import pickle
import struct
import zipfile
import zlib
from dataclasses import dataclass
from typing import Callable

import numpy as np

from chain.errors import ConfigError, first_line


def existing(path: str, key: str) -> str:
    """`path` if it is a file; else one line naming `key`."""
    if not os.path.isfile(path):
        what = "is a directory, not a file" if os.path.isdir(path) else "does not exist"
        raise ConfigError(f"{key}={path!r}: the file {what}")
    return path


def _stamp(path: str) -> tuple:
    st = os.stat(path)
    return path, st.st_mtime_ns, st.st_size


# --- .npz ------------------------------------------------------------------------------------


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


# --- CSV -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Table:
    """A CSV file: its header and its cells as float64, one row per example."""

    path: str
    columns: tuple[str, ...]
    values: np.ndarray

    def column(self, name: str, key: str) -> np.ndarray:
        if name not in self.columns:
            raise ConfigError(f"{key}={name!r} is not a column of {self.path}; its columns: {', '.join(self.columns)}")
        return self.values[:, self.columns.index(name)]


def csv_table(path: str, key: str) -> Table:
    """The CSV file `path` (a header row, then numbers), read once per version of the file."""
    return _csv_table(*_stamp(existing(path, key)), key)


def _text(path: str, key: str) -> str:
    """The file as UTF-8 text, without the byte order mark some editors write first (read as
    part of the first column's name, it would look like the name and not match it)."""
    with open(path, "rb") as f:
        raw = f.read()
    if raw.startswith(codecs.BOM_UTF8):
        raw = raw[len(codecs.BOM_UTF8) :]
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        line, line_start = raw.count(b"\n", 0, e.start) + 1, raw.rfind(b"\n", 0, e.start) + 1
        raise ConfigError(
            f"{key}={path!r} is not UTF-8 text: line {line} holds the byte "
            f"0x{raw[e.start]:02x} at column {e.start - line_start + 1}; save it as UTF-8"
        ) from None


def _header(names: list[str], path: str, key: str) -> list[str]:
    """The column names, each given and given once (a repeated name would read one column twice)."""
    names = [h.strip() for h in names]
    for i, name in enumerate(names):
        if not name:
            raise ConfigError(
                f"{key}={path!r}: column {i + 1} of the header has no name; give every column its own name"
            )
        if name in names[:i]:
            raise ConfigError(
                f"{key}={path!r}: columns {names.index(name) + 1} and {i + 1} of the header are both "
                f"called {name!r}; give every column its own name"
            )
    return names


@functools.lru_cache(maxsize=4)
def _csv_table(path: str, mtime: int, size: int, key: str) -> Table:
    reader = csv.reader(io.StringIO(_text(path, key), newline=""))
    header = next(reader, None)
    if not header:
        raise ConfigError(f"{key}={path!r} is empty; a CSV file needs a header row naming its columns")
    header = _header(header, path, key)
    rows = []
    for row in reader:
        if not row:
            continue
        line = reader.line_num
        if len(row) != len(header):
            raise ConfigError(f"{key}={path!r}: line {line} has {len(row)} fields, the header has {len(header)}")
        try:
            values = [float(v) for v in row]
        except ValueError:
            values = None
        if values is None or not all(math.isfinite(v) for v in values):
            col = next(i for i, v in enumerate(row) if not _is_finite(v))
            what = "a finite number" if _is_number(row[col]) else "a number"
            raise ConfigError(f"{key}={path!r}: line {line}, column {header[col]!r} holds {row[col]!r}, not {what}")
        rows.append(values)
    if not rows:
        raise ConfigError(f"{key}={path!r} has a header but no rows")
    return Table(path, tuple(header), np.array(rows, dtype=np.float64))


def csv_header(path: str, key: str) -> tuple[str, ...]:
    """The column names of the CSV file `path` (its first line), without reading the rest."""
    with open(existing(path, key), "rb") as f:
        first = f.readline()
    if first.startswith(codecs.BOM_UTF8):
        first = first[len(codecs.BOM_UTF8) :]
    try:
        text = first.decode("utf-8")
    except UnicodeDecodeError:
        raise ConfigError(f"{key}={path!r}: its header (line 1) is not UTF-8 text; save it as UTF-8") from None
    header = next(csv.reader([text.rstrip("\r\n")]), None)
    if not header:
        raise ConfigError(f"{key}={path!r} is empty; a CSV file needs a header row naming its columns")
    return tuple(_header(header, path, key))


def csv_rows(path: str, key: str) -> int:
    """The rows of the CSV file `path`: its lines that are not blank, the header's left out (a pass
    over the file, line by line)."""
    n = 0
    with open(existing(path, key), "rb") as f:
        for line in f:
            n += bool(line.strip())
    return max(0, n - 1)


def _is_number(v: str) -> bool:
    try:
        float(v)
    except ValueError:
        return False
    return True


def _is_finite(v: str) -> bool:
    return _is_number(v) and math.isfinite(float(v))


# --- the Keras cache -------------------------------------------------------------------------


def keras_home() -> str:
    """Keras' cache directory as Keras chooses it: `KERAS_HOME`, else `~/.keras` (`/tmp/.keras`
    when the home directory is not writable)."""
    if "KERAS_HOME" in os.environ:
        return os.environ["KERAS_HOME"]
    home = os.path.expanduser("~")
    return os.path.join(home if os.access(home, os.W_OK) else "/tmp", ".keras")


def _idx(path: str, offset: int) -> np.ndarray:
    with gzip.open(path, "rb") as f:
        return np.frombuffer(f.read(), np.uint8, offset=offset)


class _Arrays(pickle.Unpickler):
    """Unpickles NumPy arrays, lists and dicts only (CIFAR's batch files), nothing that runs code."""

    ALLOWED = {
        ("numpy", "ndarray"),
        ("numpy", "dtype"),
        ("numpy.core.multiarray", "_reconstruct"),
        ("numpy._core.multiarray", "_reconstruct"),
    }

    def find_class(self, module: str, name: str):
        if (module, name) not in self.ALLOWED:
            raise pickle.UnpicklingError(f"{module}.{name} is not allowed in a CIFAR batch file")
        return super().find_class(module, name)


def _cifar_batch(path: str) -> tuple[np.ndarray, np.ndarray]:
    with open(path, "rb") as f:
        d = _Arrays(f, encoding="bytes").load()
    x = np.asarray(d[b"data"], np.uint8).reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1)
    return x, np.asarray(d[b"labels"], np.int64)


def _read_mnist(files: list[str]) -> tuple:
    with np.load(files[0], allow_pickle=False) as f:
        return f["x_train"], f["y_train"], f["x_test"], f["y_test"]


def _read_fashion(files: list[str]) -> tuple:
    y_train, x_train, y_test, x_test = (_idx(p, 8 if "labels" in p else 16) for p in files)
    return x_train.reshape(len(y_train), 28, 28), y_train, x_test.reshape(len(y_test), 28, 28), y_test


def _read_cifar(files: list[str]) -> tuple:
    train = [_cifar_batch(p) for p in files[:-1]]
    x_test, y_test = _cifar_batch(files[-1])
    return np.concatenate([x for x, _ in train]), np.concatenate([y for _, y in train]), x_test, y_test


@dataclass(frozen=True)
class KerasSet:
    """One Keras data set: its cache files (under `KERAS_HOME/datasets`; the first folder of
    `folders` that holds them all), its shapes and sizes (fixed: tests/test_data_sources.py reads
    small stand-ins through the same code), and its reader."""

    folders: tuple[str, ...]
    files: tuple[str, ...]
    input_shape: tuple[int, ...]
    train: int
    test: int
    classes: int
    read: Callable[[list[str]], tuple]


_CIFAR = tuple(f"data_batch_{i}" for i in range(1, 6)) + ("test_batch",)
KERAS = {
    "mnist": KerasSet(("",), ("mnist.npz",), (28, 28, 1), 60000, 10000, 10, _read_mnist),
    "fashion_mnist": KerasSet(
        ("fashion-mnist",),
        (
            "train-labels-idx1-ubyte.gz",
            "train-images-idx3-ubyte.gz",
            "t10k-labels-idx1-ubyte.gz",
            "t10k-images-idx3-ubyte.gz",
        ),
        (28, 28, 1),
        60000,
        10000,
        10,
        _read_fashion,
    ),
    # Keras 3 extracts CIFAR into cifar-10-batches-py-target/; Keras 2 used cifar-10-batches-py/.
    "cifar10": KerasSet(
        ("cifar-10-batches-py-target/cifar-10-batches-py", "cifar-10-batches-py"),
        _CIFAR,
        (32, 32, 3),
        50000,
        10000,
        10,
        _read_cifar,
    ),
}


def keras_files(name: str) -> list[str]:
    """The cache files of Keras data set `name`; a ConfigError (no download) if any is missing."""
    spec = KERAS[name]
    root = os.path.join(keras_home(), "datasets")
    for folder in spec.folders:
        paths = [os.path.join(root, folder, f) for f in spec.files]
        if all(os.path.isfile(p) for p in paths):
            return paths
    first = os.path.join(root, spec.folders[0])
    missing = next(p for p in (os.path.join(first, f) for f in spec.files) if not os.path.isfile(p))
    raise ConfigError(
        f"data=keras data.name={name} reads the local Keras cache, but {missing} is missing (chain never downloads); "
        f"fill it on a machine with internet (python -c 'import keras; keras.datasets.{name}.load_data()') and copy "
        f"what that writes under ~/.keras/datasets/ into {root}, or set KERAS_HOME to a directory whose datasets/ "
        "holds it"
    )


def keras_arrays(name: str) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """`(x_train, y_train, x_test, y_test)` of Keras data set `name`: inputs float32 in [0, 1]
    with a channel axis, labels as read."""
    spec = KERAS[name]

    def scaled(x: np.ndarray) -> np.ndarray:
        return (x.astype(np.float32) / 255.0).reshape(len(x), *spec.input_shape)

    files = keras_files(name)
    try:
        x_train, y_train, x_test, y_test = spec.read(files)
        return scaled(x_train), np.asarray(y_train).reshape(-1), scaled(x_test), np.asarray(y_test).reshape(-1)
    except (OSError, ValueError, KeyError, EOFError, pickle.UnpicklingError) as e:
        raise ConfigError(
            f"data=keras data.name={name}: the cache files in {os.path.dirname(files[0])} cannot be "
            f"read ({first_line(e)}); fill the cache "
            "again"
        ) from None


# --- a Keras model file ----------------------------------------------------------------------


def keras_model_file(path: str, key: str) -> str:
    """`path` if it is a whole `.keras` file (a zip archive with the model's `config.json`, every
    member's CRC intact); else one line naming `key`: Keras itself reports an empty or cut file
    as "File not found"."""
    if os.path.getsize(path) == 0:
        raise ConfigError(f"{key}={path!r} is empty: it is not a Keras model file")
    try:
        with zipfile.ZipFile(path) as z:
            bad = z.testzip()
            if bad is not None:
                raise zipfile.BadZipFile(f"{bad} fails its CRC check")
            if "config.json" not in z.namelist():
                raise zipfile.BadZipFile("no config.json in it")
    except (zipfile.BadZipFile, zlib.error, EOFError, OSError) as e:
        raise ConfigError(
            f"{key}={path!r} is damaged (not a whole .keras zip file: "
            f"{first_line(e, typed=False)}); save the model again"
        ) from None
    return path


# --- globs -----------------------------------------------------------------------------------


def matching(pattern: str, key: str) -> list[str]:
    """The files matching the glob `pattern`, sorted; one line naming `key` when there are none."""
    files = sorted(p for p in glob.glob(os.path.expanduser(pattern), recursive=True) if os.path.isfile(p))
    if not files:
        raise ConfigError(f"{key}={pattern!r} matches no file")
    return files
