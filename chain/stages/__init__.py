"""Stages: what a chain is made of. Each stage is one Keras model (a group of layers),
its optimizer and, in mode=local, a head, all created on the stage's device.

- `stage`: the `Stage` record and `stage_name`.
- `assemble`: `build_stages` (bodies, heads, read-outs, optimizers on their devices).
- `precision`: the dtype policy each stage computes in; `loss_scale`: float16's
  dynamic loss scale, one copy per stage.
- `losses`: the loss functions (a stage's head, the chain's loss).
"""
