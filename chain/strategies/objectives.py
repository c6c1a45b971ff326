"""What each mode learns: the objective whose `heads`, `readout` and `chained` say how that
mode's stages are built, whatever the distribution.

`chain.state.remap` (restage) builds a run's stages as its mode's strategy would, without
building a strategy: it asks `objective(mode)`. Every strategy of `chain.training.ways.TABLE`
is a subclass of its mode's objective (tests/test_structure.py checks it), so the two cannot
disagree.
"""

from __future__ import annotations

from chain.strategies.base import ChainObjective, LocalObjective, Strategy
from chain.strategies.side_by_side import SideBySide

OBJECTIVES: dict[str, type[Strategy]] = {
    "local": LocalObjective,  # each stage its own head and loss
    "e2e": ChainObjective,  # one loss after the chain's read-out
    "side_by_side": SideBySide,  # independent models, each its own head, each taking the data
}


def objective(mode: str) -> type[Strategy]:
    """The class whose `heads`, `readout` and `chained` say what `mode`'s stages are built with."""
    return OBJECTIVES[mode]
