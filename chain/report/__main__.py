"""`python -m chain.report RUN_DIR [RUN_DIR ...] [-o OUT]`: one run's report (RUN_DIR/report.html), or
several runs compared (OUT, default compare.html in the current directory)."""

from __future__ import annotations

import argparse
import sys

from chain.cli import fail, import_tensorflow_quietly
from chain.errors import ChainError


def main(argv: list[str] | None = None) -> None:
    """Entry point of `python -m chain.report`."""
    ap = argparse.ArgumentParser(prog="python -m chain.report", description=__doc__.split("\n\n")[0])
    ap.add_argument("runs", nargs="+", help="run directories (Hydra's outputs/DATE/TIME)")
    ap.add_argument("-o", "--out", default=None, help="where to write the page")
    a = ap.parse_args(argv)
    import_tensorflow_quietly()  # the event files are read through TensorFlow's record reader
    from chain.report import write_comparison, write_report

    try:
        path = write_report(a.runs[0], a.out) if len(a.runs) == 1 else write_comparison(a.runs, a.out or "compare.html")
    except ChainError as e:
        fail(str(e), e.exit_code)
    print(f"report: {path}")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
