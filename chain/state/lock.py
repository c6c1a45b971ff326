"""One writer per run directory: an OS file lock held for the run's life.

`acquire(run_dir)` takes an exclusive `flock` on `RUN_DIR/.lock` and writes the holder's
PID into it. The operating system releases the lock when the process ends, however it
ends (a crash, `kill -9`), so a lock left by a dead process is never obeyed: the next run
simply takes it. A second process finds it held and gets a `RunDirLocked` naming the
holder's PID. Within one process the lock is taken once and shared (two `flock`s of one
process on one file would exclude each other). A process may hand its lock down to a child
(`handed_down`: the open file, inherited, and its number in `INHERITED_ENV`), which then holds it
too without taking it again: the lock stays held from the parent's start to its end, whatever
runs in between (`cluster.on_lost`'s supervisor and its training processes).
"""

from __future__ import annotations

import errno
import fcntl
import os
import re
import socket
import time
from contextlib import contextmanager
from typing import Iterator

from chain.errors import ChainError

FILENAME = ".lock"
NAMING_S = 3.0  # how long a refused run waits for the lock's holder to name itself
_HELD: dict[str, int] = {}  # run dir (real path) -> open file descriptor holding the lock
_INHERITED: set[str] = set()  # run dirs whose lock a parent process holds and handed down
INHERITED_ENV = "CHAIN_RUN_DIR_LOCK"  # "FD PATH": the lock of run directory PATH, inherited as descriptor FD
# What `announce` writes; anything else in the file (garbage, control bytes) is not shown to the user.
_HOLDER = re.compile(
    r"pid [1-9][0-9]{0,9} on [^\s,]{1,255}, since [0-9]{4}-[0-9]{2}-[0-9]{2} [0-9]{2}:[0-9]{2}:[0-9]{2}"
)


class RunDirLocked(ChainError):
    """Another live process is running in this run directory."""


def path(run_dir: str) -> str:
    return os.path.join(run_dir, FILENAME)


def describe(text: str) -> str:
    """The holder named by a lock file's `text` ("pid 123 on host, since ..."), or "unknown" when the
    text is not what `announce` writes (a damaged or edited file is never echoed)."""
    text = text.strip()
    return text if _HOLDER.fullmatch(text) and text.isprintable() else "unknown"


def holder(run_dir: str) -> str:
    """What the lock file says about its holder ("pid 123 on host, since ..."), or "unknown"."""
    try:
        with open(path(run_dir), "rb") as f:
            text = f.read(4096).decode(errors="replace")
    except OSError:
        return "unknown"
    return describe(text)


def held(run_dir: str) -> bool:
    """True when this process holds the lock of `run_dir`."""
    return os.path.realpath(run_dir) in _HELD


def acquire(run_dir: str, name_holder: bool = True) -> str | None:
    """Lock `run_dir` (created if missing) for this process; returns a note when the lock of a
    process that is no longer running was taken over, else None.

    With `name_holder` the lock file then names this process; without, it is left untouched
    (so a run that is refused after looking changes nothing) until `announce(run_dir)`.
    Raises `RunDirLocked` if another process holds it, or a ChainError when the directory
    cannot be created or written.
    """
    key = os.path.realpath(run_dir)
    if key in _HELD or _adopted(key):
        return None
    try:
        os.makedirs(run_dir, exist_ok=True)
        fd = os.open(path(run_dir), os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as e:
        raise ChainError(f"cannot use run directory {run_dir}: {e.strerror or e}") from None
    # A holder names itself only after it has looked at the directory (`announce`), a moment
    # after taking the lock: wait that moment, so the refusal can name it, or take the lock
    # if the holder was itself refused and let go.
    deadline = time.monotonic() + NAMING_S
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            break
        except OSError as e:
            if e.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                os.close(fd)
                raise ChainError(f"cannot lock run directory {run_dir}: {e.strerror or e}") from None
        who = holder(run_dir)
        if who != "unknown" or time.monotonic() >= deadline:
            os.close(fd)
            raise RunDirLocked(
                f"{run_dir} is in use by another run ({who}); wait for it to end, or choose another hydra.run.dir"
            )
        time.sleep(0.05)
    previous = os.read(fd, 4096).decode(errors="replace").strip()
    _HELD[key] = fd
    if name_holder:
        announce(run_dir)
    return f"took over the lock of a run that is no longer running ({describe(previous)})" if previous else None


def _adopted(key: str) -> bool:
    """Whether the lock of run directory `key` (a real path) was handed down to this process by its parent
    (`handed_down`); it is then held here too, shared with the parent, which stays named as its holder."""
    fd, _, where = os.environ.get(INHERITED_ENV, "").partition(" ")
    if where != key or not fd.isdigit():
        return False
    try:  # the inherited descriptor still open on this very lock file
        same = os.path.samestat(os.fstat(int(fd)), os.stat(path(key)))
    except OSError:
        return False
    if same:
        _HELD[key] = int(fd)
        _INHERITED.add(key)
    return same


def handed_down(run_dir: str) -> tuple[dict[str, str], int]:
    """What a child process needs to hold this process's lock of `run_dir` too: the environment's entry and
    the descriptor to pass it (`subprocess.Popen(pass_fds=...)`). The child neither announces nor releases
    it: its parent's lock is held until the parent releases it."""
    key = os.path.realpath(run_dir)
    fd = _HELD[key]
    return {INHERITED_ENV: f"{fd} {key}"}, fd


def announce(run_dir: str) -> None:
    """Write this process into the lock file of `run_dir` (which it holds; a lock handed down names the
    parent that holds it)."""
    if os.path.realpath(run_dir) in _INHERITED:
        return
    fd = _HELD[os.path.realpath(run_dir)]
    me = f"pid {os.getpid()} on {socket.gethostname()}, since {time.strftime('%Y-%m-%d %H:%M:%S')}"
    os.lseek(fd, 0, os.SEEK_SET)
    os.ftruncate(fd, 0)
    os.write(fd, (me + "\n").encode())


def release(run_dir: str, clear: bool = True) -> None:
    """Release this process's lock of `run_dir` (the file stays; an unlocked file means nothing).

    `clear` empties the file first (a run that ends cleanly leaves no holder behind).
    """
    key = os.path.realpath(run_dir)
    fd = _HELD.pop(key, None)
    if key in _INHERITED:  # the parent's lock: only this process's copy of the descriptor goes
        _INHERITED.discard(key)
        os.close(fd)
    elif fd is not None:
        if clear:
            os.lseek(fd, 0, os.SEEK_SET)
            os.ftruncate(fd, 0)
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)


@contextmanager
def reading(run_dir: str) -> Iterator[None]:
    """Hold the lock of an existing `run_dir` while reading it, so its files are not read while a run
    is writing them; `RunDirLocked` when a live run holds it. The lock file is left as it was found
    (created and removed again if there was none). A missing directory is not locked (nor created):
    the reader reports it."""
    if not os.path.isdir(run_dir) or held(run_dir):
        yield
        return
    had_file = os.path.exists(path(run_dir))
    try:
        acquire(run_dir, name_holder=False)
    except RunDirLocked:
        raise RunDirLocked(
            f"{run_dir} is in use by a run that is still training ({holder(run_dir)}); "
            "try again after that run has ended"
        ) from None
    try:
        yield
    finally:
        release(run_dir, clear=False)
        if not had_file:
            try:
                os.remove(path(run_dir))
            except OSError:
                pass
