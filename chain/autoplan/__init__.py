"""`placement.plan=auto`: the plan chosen by measuring the model on the run's devices, in one package.

The build (`chain.training.build`) asks `settle.wanted` and calls `settle.settle` once the user's placement is
applied: the pool of devices, the measurements (`measure`, timed by `chain.stages.clock` as balance=time is) or
RUN_DIR/plan_costs.json's (`cache`), every candidate plan predicted and ranked (`search`, each schedule played by
`chain.schedule.schedules.play_timed`), what it may choose, each candidate's memory estimate and the chosen
candidate's settings and `RunSpec` (`choice`). A run shows the choice (`table`: plan_only's table, the chosen
line, summary.json's `plan`) and checks its measured step against the prediction once (`step_check`). The
records that cross these modules and the rest of chain are `chain.records.auto_plan`'s; what plan=auto refuses in
the user's config is `chain.config.checks.check_auto_plan`'s, raised before TensorFlow starts.

This `__init__` imports nothing, so the TensorFlow-free modules (`search`, `cache`, `choice`, `table`,
`step_check`) load without it.
"""
