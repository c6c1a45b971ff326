"""The pipeline: everything a pipeline schedule is, in one place, so a new schedule touches this
package only.

- `schedules`: the schedule as data (`Action`, `Schedule`, the builders, `simulate`, the
  rendered plan) and the vocabulary of op names (`Action.scope` / `Action.parse`,
  `update_scope` / `update_stage`). No TensorFlow, and no import from the rest of chain:
  the config takes the schedule names from it.
- `step`: mode=e2e's step, a schedule run in one `tf.function`, its ops named by `Action.scope`.
- `timeline`: a profiler trace of that step read back into the measured actions
  (`Action.parse`), their statistics and the balance advice.

The strategy that compiles the step, `PipelinedChain`, stays in `chain.strategies.pipelined`
beside `PipelinedLocal`: both share the `Pipelined` distribution, and `chain.strategies`
(its `TABLE`) imports every strategy.

This file imports nothing, so that importing `chain.pipeline.schedules` stays free of TensorFlow.
"""
