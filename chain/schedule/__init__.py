"""Pipeline schedules as data, without TensorFlow and without anything else of chain, so that the
config (`chain.config`: `pipeline.schedule`'s names, the schedule a run's settings ask for) and
every later layer can read them.

- `schedules`: the schedule as data (`Action`, `Schedule`, the builders and their rows of
  `BUILDERS`, the timed player `play_timed` and `simulate`, the rendered plan) and the vocabulary of op names (`Action.scope` / `Action.parse`,
  `update_scope` / `update_stage`).
- `schedule_file`: a schedule as a CSV file (`pipeline.schedule=file`), read and written.

The step that runs a schedule, its strategy and the reading of a traced step are `chain.pipeline`'s.
This file imports nothing.
"""
