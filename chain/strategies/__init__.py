"""Strategies: one object per way of training, a distribution given an objective, chosen once
from the assignment's topology and the mode.

| `Assignment.topology` | mode=local (`LocalObjective`) | mode=e2e (`ChainObjective`) |
|---|---|---|
| `pipeline` (a device per stage) | `DevicePerStage` | `Scheduled` (in `chain.pipeline.strategy`) |
| `mirrored` (every stage on every replica) | `Mirrored` | `Mirrored` |

and mode=side_by_side (independent models, a device each or shared): `SideBySide` with `Independent`.

A strategy (a distribution: `chain.strategies.base.Strategy`) builds the stages in its scope,
compiles the step, splits a batch for it and reports its own summary fields. What each mode
learns (its stages' heads and read-out, its targets, losses and read-outs) is its objective
(`chain.strategies.objectives`), which the strategy holds. The table of every way of training,
which imports every distribution, is `chain.training.ways.TABLE`: a layer above this package
and `chain.pipeline`, whose `Scheduled` builds on this one.

This file imports nothing, so that `chain.pipeline.strategy` can import `chain.strategies`.
"""
