"""The pipeline: a schedule run, in one place. The schedule as data (`Action`, `Schedule`, the
builders, `simulate`, the op names) is `chain.schedule`'s, a lower layer that the config reads too.

- `play`: mode=e2e's step, a schedule played in one `tf.function` (`Playbook`: what every play is
  given), its ops named by `Action.scope`.
- `strategy`: `Scheduled`, the distribution that runs the schedule and compiles the step (given
  the chain's objective, `chain.strategies.objectives.ChainObjective`); `replicas`: `Replicated`,
  R copies of it.
- `timeline`: a profiler trace of that step read back into the measured actions
  (`Action.parse`), their statistics and the balance advice; `measured_grid`: a measured step as
  the plan's text grid, a cell per action (no TensorFlow).
- `progress`: the markers of how far each device of a running step has come, each kept by its device's process
  (`trainer.stall_s`); `stalled`: where a stalled step waits, from them (no TensorFlow).

This package comes after `chain.strategies` in the layer order (docs/architecture.md). This
file imports nothing, so that importing `chain.pipeline.timeline` stays free of TensorFlow.
"""
