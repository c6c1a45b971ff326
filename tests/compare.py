"""Comparing two trainings of the same chain, variable by variable."""

import numpy as np


def weights(run) -> list[np.ndarray]:
    """Every trainable variable of every stage, in order."""
    return [v.numpy() for s in run.stages for v in s.trainable_variables]


def rel_diff(a, b) -> float:
    """Largest elementwise difference relative to the largest magnitude of the reference."""
    return float(np.max(np.abs(a - b)) / max(np.max(np.abs(b)), 1e-12))
