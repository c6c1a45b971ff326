"""User-facing errors: one readable line, no traceback. The exit code says what kind.

2  bad input: a config, a device, a batch, a run directory in use, a checkpoint that
   cannot be restored (ConfigError, DeviceError, CheckpointError, ...)
3  training stopped on a non-finite loss or gradient (chain.steps.numerics)
4  the file system failed during a run (StorageError): full, read-only, gone
5  a cluster worker was lost during a run (WorkerLost)
6  out of memory with the smallest batch allowed (OutOfMemory, mode=side_by_side)
7  no step completed for trainer.stall_s seconds, with trainer.stall_action=stop (Stalled)
"""

from collections.abc import Iterable


class ChainError(Exception):
    """An error the user can fix; the CLI prints its message alone and exits `exit_code`."""

    exit_code = 2


class ConfigError(ChainError):
    """A config value that is not allowed; the message names the key."""


class DeviceError(ChainError):
    """A device that does not exist or a placement that cannot be made."""


class CheckpointError(ChainError):
    """A checkpoint that is missing, damaged, or not this run's or this stage's; the message names the file."""


class StorageError(ChainError):
    """Writing the run's files failed (disk full, read-only, ...); the last complete checkpoint is intact."""

    exit_code = 4


class WorkerLost(ChainError):
    """A cluster worker stopped answering during a run; the message names it."""

    exit_code = 5


class OutOfMemory(ChainError):
    """A device ran out of memory and the batch cannot shrink further (`oom.min_batch_size`)."""

    exit_code = 6


class Stalled(ChainError):
    """No step completed for `trainer.stall_s` seconds and `trainer.stall_action=stop`: the run's
    watch prints where the step waits and ends the process with this code (its training thread is
    inside TensorFlow and cannot be interrupted)."""

    exit_code = 7


def first_line(e: BaseException, typed: bool = True) -> str:
    """The first line of `e`'s message (TensorFlow's `.message` when it has one), after `Type: `
    when `typed`; the type's name alone when the message is empty. Library errors run to many
    lines (tracebacks of the graph, hints); a user-facing line quotes the first."""
    text = str(getattr(e, "message", None) or e).strip()
    if not text:
        return type(e).__name__
    line = text.splitlines()[0].strip()
    return f"{type(e).__name__}: {line}" if typed else line


def instantiate_error(e: BaseException, what: str) -> ConfigError:
    """The one line for `what` (a user's `_target_` that Hydra's `instantiate` called) that
    failed: Hydra could not import the target ("WHAT: cannot import it (why)", why being the
    import error Hydra chains, not its advice to set HYDRA_FULL_ERROR), or the target itself
    raised, which Hydra wraps ("WHAT raised Type: first line", the target's own error)."""
    from hydra.errors import InstantiationException

    if isinstance(e, InstantiationException):
        cause = e.__cause__
        if str(e).startswith("Error locating target"):
            why = " ".join(str(cause).split("\n")[1:]).strip() if cause is not None else ""
            return ConfigError(f"{what}: cannot import it ({why or first_line(e, typed=False)})")
        if cause is not None:
            e = cause
    return ConfigError(f"{what} raised {first_line(e)}")


def closest(word: str, options: Iterable[str]) -> str | None:
    """The option closest to a mistyped `word` by difflib's ratio, or None: among the options
    that contain it if any (`float16` -> `mixed_float16`), else among all (a ratio of at least 0.6)."""
    import difflib

    options = [str(o) for o in options]
    holding = [o for o in options if len(str(word)) >= 3 and str(word) in o]
    found = difflib.get_close_matches(str(word), holding or options, n=1, cutoff=0.0 if holding else 0.6)
    return found[0] if found else None


# Keys whose old spelling is refused naming the new one: one word for one idea in every data source.
RENAMED = {"data.files": "data.path", "data.val_files": "data.val_path"}


def did_you_mean(key: str, known: Iterable[str]) -> str:
    """`; did you mean K?` for an unknown dotted `key` (`trainer.stpes`), or '' when nothing is close.

    `known` are the dotted keys that exist. K is the new spelling of a renamed key (`RENAMED`:
    `data.files` -> `data.path`); else a key of another section with the same last part
    (`steps` -> `trainer.steps`, `trainer.lr` -> `optim.lr`); failing that, the key of the same
    section whose last part is closest (`trainer.stpes` -> `trainer.steps`)."""
    if key in RENAMED:
        return f"; did you mean {RENAMED[key]}?"
    parent, _, leaf = key.rpartition(".")
    known = [str(k) for k in known]
    found = sorted(k for k in known if k.rpartition(".")[2] == leaf and k != key)
    if not found:
        siblings = {k.rpartition(".")[2]: k for k in known if k.rpartition(".")[0] == parent}
        near = closest(leaf, siblings)
        found = [siblings[near]] if near else []
    return f"; did you mean {' or '.join(found[:3])}?" if found else ""


def plural(n: int, word: str) -> str:
    """`n` and `word`, plural unless `n` is 1: `1 microbatch`, `4 microbatches`, `2 stages`, `3 entries`."""
    if n == 1:
        return f"{n} {word}"
    if word.endswith("y") and word[-2:-1] not in ("a", "e", "i", "o", "u"):
        return f"{n} {word[:-1]}ies"
    return f"{n} {word}es" if word.endswith(("ch", "sh", "s", "x")) else f"{n} {word}s"


def there_are(n: int, word: str) -> str:
    """`there is 1 stage`, `there are 3 stages`."""
    return f"there {'is' if n == 1 else 'are'} {plural(n, word)}"
