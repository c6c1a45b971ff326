"""How a test compares an error line with the message it expects."""

from __future__ import annotations


def says(line: str, message: str) -> bool:
    """`message` is in `line`, and a list it ends with ("allowed: local, e2e") is the whole list
    in `line`, not its first few (a partial list would hide a value added or lost)."""
    at = line.find(message)
    if at < 0:
        return False
    ends_in_a_list = ", " in message.rsplit(": ", 1)[-1] if ": " in message else False
    return not (ends_in_a_list and line[at + len(message) :].startswith(","))
