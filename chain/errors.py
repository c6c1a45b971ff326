"""User-facing errors: one readable line, no traceback."""


class ChainError(Exception):
    """An error the user can fix; the CLI prints its message alone and exits `exit_code`."""

    exit_code = 2


class ConfigError(ChainError):
    """A config value that is not allowed; the message names the key."""


class DeviceError(ChainError):
    """A device that does not exist or a placement that cannot be made."""
