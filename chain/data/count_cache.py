"""Record counts of streamed files kept on disk, so that a second run over the same files does not
count them again (`data.stream=true`: TFRecord records, CSV rows). No TensorFlow.

A count is kept in a small JSON file beside the data (`.chain-counts.json` in the file's folder,
hidden from globs), keyed by the file's absolute path, size and modification time (ns) and by what
was counted; where that folder is not writable, in the user's cache folder
(`$XDG_CACHE_HOME/chain/counts.json`, `~/.cache/chain/counts.json` by default). A file changed in
any of these is counted again. The log says, per glob, whether the files were counted or their
counts read from the cache, and how many there are in all. Within a process the counts are also
kept in memory, with when they were counted: the command line counts while it checks the config,
before the run's log is open, and the run's log then says when that was.
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
import time
from typing import Callable, NamedTuple

log = logging.getLogger("chain")

NAME = ".chain-counts.json"


class _Known(NamedTuple):
    """A file's count kept in this process: how it was found ('counted' or 'cache'), when, and the pass's seconds."""

    count: int
    how: str
    when: float
    seconds: float


_memory: dict[tuple, _Known] = {}  # (path, stamp) -> what this process found


def user_cache(name: str) -> str:
    """`name` in chain's folder of the user's cache: `$XDG_CACHE_HOME/chain/`, `~/.cache/chain/` by default."""
    root = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(root, "chain", name)


def _entry(path: str, what: str) -> tuple[str, str]:
    """The key of `path`'s count of `what`: (absolute path, 'what size mtime_ns')."""
    st = os.stat(path)
    return os.path.abspath(path), f"{what} {st.st_size} {st.st_mtime_ns}"


def _read(cache: str) -> dict:
    try:
        with open(cache) as f:
            table = json.load(f)
        return table if isinstance(table, dict) else {}
    except (OSError, ValueError):  # none yet, or unreadable: count again (a cache is never an error)
        return {}


def _write(cache: str, table: dict) -> bool:
    """`table` written to `cache` atomically (a temporary file renamed); False where not writable."""
    try:
        os.makedirs(os.path.dirname(cache), exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".chain-counts-", dir=os.path.dirname(cache))
        with os.fdopen(fd, "w") as f:
            json.dump(table, f, indent=0, sort_keys=True)
        os.replace(tmp, cache)
        return True
    except OSError:
        return False


def counts(paths: list[str], key: str, what: str, count: Callable[[str], int]) -> tuple[int, ...]:
    """Each file's count of `what` (e.g. 'tfrecord records'), by `count(path)` or from the cache;
    `key` names the glob in the log lines that say which (said again on every call: the command
    line's first call comes before its log file is open)."""
    entries = [_entry(p, what) for p in paths]
    found: dict[int, _Known] = {i: _memory[e] for i, e in enumerate(entries) if e in _memory}
    tables: dict[str, dict] = {}
    for i, (path, stamp) in enumerate(entries):
        if i in found:
            continue
        for cache in (os.path.join(os.path.dirname(path), NAME), user_cache("counts.json")):
            table = tables.setdefault(cache, _read(cache))
            n = table.get(path, {}).get(stamp)
            if isinstance(n, int):
                found[i] = _memory[path, stamp] = _Known(n, "cache", time.time(), 0.0)
                break
    fresh = [i for i in range(len(paths)) if i not in found]
    if fresh:
        log.info("counting the %s of %d file(s) of %s (a pass over them; the counts are cached)", what, len(fresh), key)
        for i in fresh:
            path, stamp = entries[i]
            start = time.time()
            n = count(paths[i])
            found[i] = _memory[path, stamp] = _Known(n, "counted", start, time.time() - start)
        _store([entries[i] + (found[i].count,) for i in fresh])
    for how in ("cache", "counted"):
        known = [k for i, k in found.items() if i not in fresh and k.how == how]
        if not known:
            continue
        total = f"{what} of {len(known)} file(s) of {key}: {sum(k.count for k in known):,} in all"
        if how == "cache":
            log.info("%s, from the count cache (%s beside the data, or %s)", total, NAME, user_cache("counts.json"))
        else:
            when = time.strftime("%H:%M:%S", time.localtime(min(k.when for k in known)))
            log.info(
                "%s, counted by a pass over them at %s earlier in this process (%.2f s; the counts are cached)",
                total,
                when,
                sum(k.seconds for k in known),
            )
    return tuple(found[i].count for i in range(len(paths)))


def forget() -> None:
    """Drop the counts kept in this process's memory (the disk cache is then what a count finds)."""
    _memory.clear()


def _store(counted: list[tuple[str, str, int]]) -> None:
    """Each new count kept beside its file, else in the user's cache folder (else in memory only)."""
    by_cache: dict[str, list] = {}
    for path, stamp, n in counted:
        by_cache.setdefault(os.path.join(os.path.dirname(path), NAME), []).append((path, stamp, n))
    for cache, items in by_cache.items():
        for target in (cache, user_cache("counts.json")):
            table = _read(target)
            for path, stamp, n in items:
                table[path] = {stamp: n}  # the file's older versions dropped
            if _write(target, table):
                break
