"""A run's memory estimate from its settings: each stage's cost (`chain.config.shapes`), the
microbatches its schedule holds (`chain.schedule.schedules.held_counts`) and its batch, made into
`chain.planning.footprint.Footprint`s; and the same for the changes that would make a plan fit
(more microbatches, `pipeline.recompute=always`), which `chain.planning.fit` offers when it refuses.
"""

from __future__ import annotations

import math
from dataclasses import replace

from chain.config import Settings, schedule_choice
from chain.config.checks import BatchCut, batch_cut
from chain.config.shapes import optimizer_slots, stage_shapes
from chain.data.catalog import DataInfo
from chain.errors import ChainError
from chain.planning.footprint import Footprint, StageCost, estimates
from chain.planning.planner import MIRRORED, Assignment
from chain.schedule import schedules
from chain.schedule.schedules import Schedule

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
        out.append(
            StageCost(
                shape.params,
                shape.activations_per_example + logits,
                math.prod(shape.input_shape),
                math.prod(shape.output_shape),
                shape.largest_layer,
            )
        )
    return out


def schedule_played(s: Settings, assignment: Assignment, schedule: Schedule | None) -> Schedule | None:
    """The schedule the run plays: mode=e2e's (the run's, `RunSpec.schedule`), unless mirrored replicas
    run the chain whole (`placement.fallback=mirrored`: microbatches do not apply); else None."""
    return schedule if s.mode == "e2e" and assignment.topology != MIRRORED else None


def held(s: Settings, schedule: Schedule | None) -> list[int]:
    """Per stage, the microbatches `schedule` (what the run plays, `played`) holds at once (1 without
    one: one batch)."""
    if schedule is None:
        return [1] * len(s.stages)
    return schedules.held_counts(schedule)


def output_gradients(schedule: Schedule | None) -> list[int] | None:
    """Per stage, the microbatches' layer-output gradients a split schedule (zb1) adds to its busiest
    moment (None without a schedule played)."""
    return None if schedule is None else schedules.output_gradients_held(schedule)


def footprints(
    s: Settings, info: DataInfo, assignment: Assignment, cut: BatchCut, schedule: Schedule | None
) -> list[Footprint | None]:
    """Each stage's estimated peak for `s` planned as `assignment`, its batch cut as `cut` (the run's,
    `RunSpec.batch_cut`), with `schedule` (the run's; None outside mode=e2e)."""
    return from_costs(s, assignment, cut, stage_costs(s, info), schedule)


def from_costs(
    s: Settings, assignment: Assignment, cut: BatchCut, costs: list[StageCost | None], schedule: Schedule | None
) -> list[Footprint | None]:
    """Each stage's estimated peak from its `StageCost` (the config's, or a cut model's layers'), for
    `cut` (each replica's share and microbatch), `schedule` (`s`'s, built once by the preparation pass)
    where the run plays it, and `s`'s recompute and optimizers, planned as `assignment`."""
    schedule = schedule_played(s, assignment, schedule)
    pipelined = schedule is not None
    return estimates(
        costs,
        slots=[optimizer_slots(st.optim) for st in s.stages],
        batch=cut.per_replica,
        microbatch=cut.per_microbatch,
        held=held(s, schedule),
        output_gradients=output_gradients(schedule),
        recompute=s.pipeline.recompute if pipelined else "never",
        own_inputs=assignment.kind == "GPU" or bool(assignment.cluster),
        chained=s.mode != "side_by_side",
        layer_by_layer=pipelined and not s.trainer.jit_compile,
    )  # chain.pipeline.play.weights_first


def alternatives(
    s: Settings, info: DataInfo, assignment: Assignment, cut: BatchCut, schedule: Schedule | None
) -> dict[str, list[Footprint | None]]:
    """The footprints of the changes that lower a pipeline's activations: pipeline.recompute=always
    (on `schedule` and `cut`, the run's), and 2x and 4x the microbatches where the batch cuts into them
    (`batch_cut`'s rule; built-in schedules only; each such schedule built here, as the run would build it)."""
    if schedule_played(s, assignment, schedule) is None:
        return {}
    p, out = s.pipeline, {}
    options = [] if p.recompute == ALWAYS else [(f"pipeline.recompute={ALWAYS}", replace(p, recompute=ALWAYS))]
    if p.schedule != schedules.FILE:
        options += [
            (f"pipeline.microbatches={p.microbatches * times}", replace(p, microbatches=p.microbatches * times))
            for times in (2, 4)
        ]
    for change, pipeline in options:
        try:
            other = replace(s, pipeline=pipeline)
            if pipeline.microbatches == p.microbatches:  # recompute changes the estimate, not the schedule
                out[change] = footprints(other, info, assignment, cut, schedule)
            else:
                batch = cut.per_replica * cut.replicas
                other_cut = batch_cut(batch, cut.replicas, pipeline.microbatches)
                out[change] = footprints(other, info, assignment, other_cut, schedule_choice.pipeline_schedule(other))
        except ChainError:  # a batch or schedule that cannot take that many microbatches: not offered
            continue
    return out
