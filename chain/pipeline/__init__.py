"""The pipeline: everything a pipeline schedule is, in one place, so a new schedule touches this
package only.

- `schedules`: the schedule as data (`Action`, `Schedule`, the builders, `simulate`, the
  rendered plan) and the vocabulary of op names (`Action.scope` / `Action.parse`,
  `update_scope` / `update_stage`). No TensorFlow.
- `step`: mode=e2e's step, a schedule run in one `tf.function`, its ops named by `Action.scope`.
- `strategy`: `Scheduled`, the distribution that runs the schedule and compiles the step (given
  the chain's objective, `chain.strategies.objectives.ChainObjective`); `replicas`: `Replicated`,
  R copies of it.
- `timeline`: a profiler trace of that step read back into the measured actions
  (`Action.parse`), their statistics and the balance advice.
- `progress`: the host's markers of how far each device of a running step has come
  (`trainer.stall_s`); `stalled`: where a stalled step waits, from them (no TensorFlow).

This package comes after `chain.strategies` in the layer order (docs/architecture.md). This
file imports nothing, so that importing `chain.pipeline.schedules` or `chain.pipeline.timeline`
stays free of TensorFlow.
"""
