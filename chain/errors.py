"""User-facing errors: one readable line, no traceback. The exit code says what kind.

    2  bad input: a config, a device, a batch, a run directory in use, a checkpoint that
       cannot be restored (ConfigError, DeviceError, CheckpointError, ...)
    3  training stopped on a non-finite loss or gradient (chain.steps.numerics)
    4  the file system failed during a run (StorageError): full, read-only, gone
    5  a cluster worker was lost during a run (WorkerLost)
    6  out of memory with the smallest batch allowed (OutOfMemory, mode=side_by_side)
"""


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
