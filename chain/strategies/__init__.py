"""Strategies: one object per way of training, chosen once from the placement and the mode.

| `placement.layout` | mode=local | mode=e2e |
|---|---|---|
| `pipeline` (a device per stage) | `PipelinedLocal` | `PipelinedChain` (in `chain.pipeline.strategy`) |
| `mirrored` (every stage on every replica) | `MirroredLocal` | `MirroredChain` |

and mode=side_by_side (independent models, a device each or shared): `SideBySide`.

A strategy builds the stages in its scope, compiles the step, splits a batch for it and
reports its own summary fields (`chain.strategies.base.Strategy`). What each mode learns
(its stages' heads and read-out) is its objective (`chain.strategies.objectives`). The table
of every way of training, which imports every strategy, is `chain.training.ways.TABLE`: a
layer above this package and `chain.pipeline`, whose `PipelinedChain` builds on this one.

This file imports nothing, so that `chain.pipeline.strategy` can import `chain.strategies`.
"""
