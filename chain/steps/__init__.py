"""Steps: the compiled training step of each way of training, and the pieces they share.

- `ops`: explicit copies between devices (`copy_to`), chunks, gradient sums.
- `update`: `apply_update` (every update goes through it: numerics guard, loss scaling),
  `shared_outcomes` (one float16 decision for a chain with one loss).
- `local`: mode=local's step. `pipeline`: mode=e2e's step running a pipeline schedule.
  `replica`: one replica's step in a mirrored run. `inference`: the chain's forward pass.
- `numerics`: the NaN/Inf guard. `xla`: per-stage XLA compilation.
"""
