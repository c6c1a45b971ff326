"""The run report: `python -m chain.report RUN_DIR` writes `RUN_DIR/report.html`, one
self-contained page (figures embedded as PNG) with the run's curves per stage, the
placement, the planned and measured timelines, memory, throughput and config;
`python -m chain.report DIR1 DIR2 ...` compares runs. `report=true` writes it at the end of
every run.

Modules: `scalars` (TensorBoard event files, merged across a resume), `runs` (what a run
directory holds), `plots` (matplotlib figures), `page` (the HTML).
"""

from __future__ import annotations

import os
from typing import Sequence

REPORT = "report.html"


def write_report(run_dir: str, out: str | None = None) -> str:
    """Write the report of the run in `run_dir` (to `out`, default `run_dir/report.html`); returns its path."""
    from chain.report import page, runs
    from chain.state.atomic import write_text, writing

    out = out or os.path.join(run_dir, REPORT)
    text = page.single(runs.load(run_dir))
    with writing(out):
        write_text(out, text)
    return out


def write_comparison(run_dirs: Sequence[str], out: str) -> str:
    """Write the page comparing the runs in `run_dirs` to `out`; returns its path."""
    from chain.report import page, runs
    from chain.state.atomic import write_text, writing

    text = page.comparison([runs.load(d) for d in run_dirs])
    with writing(out):
        write_text(out, text)
    return out
