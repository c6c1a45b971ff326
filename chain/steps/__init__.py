"""Steps: the compiled training step of each way of training, and the pieces they share.

- `ops`: explicit copies between devices (`copy_to`), chunks, gradient sums.
- `update`: `apply_update` (every update goes through it: numerics guard, loss scaling),
  `shared_outcomes` (one float16 decision for a chain with one loss).
- `local`: mode=local's step. `forward`: one stage of the chain (mode=e2e's pipeline step,
  `chain.pipeline.play`, and `replica`). `replica`: one replica's step in a mirrored run.
  `independent`: mode=side_by_side's steps. `inference`: the chain's forward pass.
- `numerics`: the NaN/Inf guard. `xla`: per-stage XLA compilation.
"""
