"""The user's paths, checked with the standard library alone (no TensorFlow): a file that exists
(`existing`), the files of a glob (`matching`), a file's version for caches keyed by it
(`version`), and a `.keras` model file that is whole (`keras_model_file`: not empty, not cut
short). Each problem is one `ConfigError` line naming the config key."""

from __future__ import annotations

import glob
import os
import zipfile
import zlib

from chain.errors import ConfigError, first_line


def existing(path: str, key: str) -> str:
    """`path` if it is a file; else one line naming `key`."""
    if not os.path.isfile(path):
        what = "is a directory, not a file" if os.path.isdir(path) else "does not exist"
        raise ConfigError(f"{key}={path!r}: the file {what}")
    return path


def version(path: str) -> tuple:
    """(path, modification time, size): what a cache of the file's contents is keyed by."""
    st = os.stat(path)
    return path, st.st_mtime_ns, st.st_size


def matching(pattern: str, key: str) -> list[str]:
    """The files matching the glob `pattern`, sorted; one line naming `key` when there are none."""
    files = sorted(p for p in glob.glob(os.path.expanduser(pattern), recursive=True) if os.path.isfile(p))
    if not files:
        raise ConfigError(f"{key}={pattern!r} matches no file")
    return files


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
