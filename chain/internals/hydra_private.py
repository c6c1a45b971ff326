"""Hydra's private parts chain uses (`hydra._internal`): its command line's argument parser and
its basic sweeper's expansion of overrides into jobs. Hydra has no public API for either, and
chain must read the command line and count a sweep's jobs exactly as Hydra will."""

from __future__ import annotations

from typing import Any, Sequence


def args_parser() -> Any:
    """The `argparse` parser of Hydra's command line (`hydra._internal.utils.get_args_parser`):
    which arguments Hydra reads as flags and which as overrides."""
    from hydra._internal.utils import get_args_parser

    return get_args_parser()


def split_sweep(parsed: Sequence[Any]) -> list[list[list[str]]]:
    """The batches of jobs (each job its list of overrides) that Hydra's basic sweeper makes of
    parsed overrides (`hydra._internal.core_plugins.basic_sweeper.BasicSweeper.split_arguments`,
    with no batch size limit): what `--multirun` will run."""
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper

    return BasicSweeper.split_arguments(parsed, None)
