"""A run's memory estimate from its settings: each stage's cost (`chain.config.shapes`), the
microbatches its schedule holds (`chain.pipeline.schedules.held_counts`) and its batch, made into
`chain.planning.footprint.Footprint`s; and the same for the changes that would make a plan fit
(more microbatches, `pipeline.recompute=always`), which `chain.planning.fit` offers when it refuses.
"""

from __future__ import annotations

import math
from dataclasses import replace

from chain.config import Settings
from chain.config.shapes import optimizer_slots, stage_shapes
from chain.data.catalog import DataInfo
from chain.errors import ChainError
from chain.pipeline import schedules, selection
from chain.pipeline.schedules import Schedule
from chain.planning.footprint import Footprint, StageCost, estimates
from chain.planning.planner import Placement

ALWAYS = "always"


def stage_costs(s: Settings, info: DataInfo) -> list[StageCost | None]:
    """Each stage's `StageCost` as the config describes it (None for a builder's or a cut model's
    stage and those after it: known once built). A stage with a head or read-out (every stage in
    mode=local and side by side, the last in mode=e2e) also holds its logits."""
    shapes = stage_shapes(s.stages, info, s.mode)
    out: list[StageCost | None] = []
    for k, (shape, stage) in enumerate(zip(shapes, s.stages)):
        if shape is None:
            out.append(None)
            continue
        head = s.mode != "e2e" or k == len(shapes) - 1
        logits = (info.target(stage.target).classes or 1) if head else 0
        out.append(StageCost(shape.params, shape.activations_per_example + logits, math.prod(shape.input_shape),
                             math.prod(shape.output_shape), shape.largest_layer))
    return out


def held(s: Settings, schedule: Schedule | None) -> list[int]:
    """Per stage, the microbatches `schedule` (the run's, `RunSpec.schedule`) holds at once (1
    outside mode=e2e: one batch)."""
    if s.mode != "e2e":
        return [1] * len(s.stages)
    return schedules.held_counts(schedule)


def output_gradients(s: Settings, schedule: Schedule | None) -> list[int] | None:
    """Per stage, the microbatches' layer-output gradients a split schedule (zb1) adds to its busiest
    moment (None outside mode=e2e)."""
    return schedules.output_gradients_held(schedule) if s.mode == "e2e" else None


def footprints(s: Settings, info: DataInfo, placement: Placement, schedule: Schedule | None) -> list[Footprint | None]:
    """Each stage's estimated peak for `s` planned as `placement` (its per-replica batch), with
    `schedule` (the run's; None outside mode=e2e)."""
    return from_costs(s, placement, stage_costs(s, info), schedule)


def from_costs(s: Settings, placement: Placement, costs: list[StageCost | None], schedule: Schedule | None
               ) -> list[Footprint | None]:
    """Each stage's estimated peak from its `StageCost` (the config's, or a cut model's layers'), for
    `schedule` (`s`'s, built once by the preparation pass) and `s`'s microbatches, recompute and
    optimizers, planned as `placement`."""
    e2e = s.mode == "e2e"
    return estimates(costs, slots=[optimizer_slots(st.optim) for st in s.stages],
                     batch=placement.per_replica_batch or s.data.batch_size,
                     microbatches=s.pipeline.microbatches if e2e else 1, held=held(s, schedule),
                     output_gradients=output_gradients(s, schedule),
                     recompute=s.pipeline.recompute if e2e else "never",
                     own_inputs=placement.kind == "GPU" or bool(placement.cluster), chained=s.mode != "side_by_side",
                     layer_by_layer=e2e and not s.trainer.jit_compile)  # chain.pipeline.step.weights_first


def alternatives(s: Settings, info: DataInfo, placement: Placement, schedule: Schedule | None
                 ) -> dict[str, list[Footprint | None]]:
    """The footprints of the changes that lower a pipeline's activations: pipeline.recompute=always
    (on `schedule`, the run's), and 2x and 4x the microbatches where the batch divides into them
    (built-in schedules only; each such schedule built here, as the run would build it)."""
    if s.mode != "e2e":
        return {}
    p, out = s.pipeline, {}
    options = [] if p.recompute == ALWAYS else [(f"pipeline.recompute={ALWAYS}", replace(p, recompute=ALWAYS))]
    per = placement.per_replica_batch or s.data.batch_size
    for times in (2, 4):
        m = p.microbatches * times
        if p.schedule != schedules.FILE and per % m == 0:
            options.append((f"pipeline.microbatches={m}", replace(p, microbatches=m)))
    for change, pipeline in options:
        try:
            other = replace(s, pipeline=pipeline)
            same = pipeline.microbatches == p.microbatches  # recompute changes the estimate, not the schedule
            out[change] = footprints(other, info, placement, schedule if same else selection.pipeline_schedule(other))
        except ChainError:  # a schedule that cannot take that many microbatches: not offered
            continue
    return out
