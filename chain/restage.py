"""`python -m chain.restage SRC DST [overrides]`: continue a run with its layers split into a
different number of stages (the work is `chain.state.remap.restage`)."""

from __future__ import annotations

import sys
from typing import Sequence

from chain.cli import fail, import_tensorflow_quietly
from chain.errors import ChainError, plural

USAGE = "usage: python -m chain.restage SRC_RUN_DIR DST_RUN_DIR [overrides...]   e.g. +stages=2"


def main(argv: Sequence[str] | None = None) -> None:
    """Entry point of `python -m chain.restage SRC DST [overrides]`."""
    args = list(sys.argv[1:] if argv is None else argv)
    if args and args[0] in ("-h", "--help"):
        from chain.state import remap as logic

        print(USAGE)
        print(logic.__doc__.split("\n\n", 1)[1])
        return
    if len(args) < 2 or "=" in args[0] or "=" in args[1]:
        fail(f"restage needs SRC and DST run directories; {USAGE}")
    try:
        from chain.config import normalize_overrides

        overrides = normalize_overrides(args[2:])
        import_tensorflow_quietly()
        from chain.state.remap import restage

        report = restage(args[0], args[1], overrides)
    except ChainError as e:
        fail(str(e), e.exit_code)
    print(
        f"restaged step {report['step']}: {plural(report['src_stages'], 'stage')} -> {plural(report['dst_stages'], 'stage')} "
        f"({' '.join(report['overrides'])})"
    )
    for line in report["heads"]:
        print(f"  {line}")
    print(f"continue with: {report['resume_command']}")


if __name__ == "__main__":
    main()
