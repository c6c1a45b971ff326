"""`placement.plan=auto` on the preparation side: what it may choose, each candidate's memory estimate,
and the chosen candidate made into the run's `RunSpec`.

The search itself is `chain.autoplan.search` (pure, on measured `Costs`); measuring needs TensorFlow and
is `chain.autoplan.settle`'s. Here: the settings a candidate runs (`chosen_settings`: the user's
settings with `Candidate.overrides()` applied and checked again, as `+stages=K pipeline.microbatches=M
...` on the command line would give), each candidate's per-stage peak from the memory estimate
(`chain.prepared.estimate.from_costs`, the same arithmetic a manual plan is refused by), each pool
device's memory (`chain.planning.fit`), and `chosen_spec`: the `RunSpec` `prepare` makes for those
settings, carrying the search's outcome (`RunSpec.auto_plan`). No TensorFlow.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Callable, Sequence

from chain.config import Settings, checks
from chain.config.schema import Gpt, KerasModel
from chain.autoplan import search
from chain.planning import fit
from chain.planning.footprint import StageCost
from chain.records.auto_plan import AutoPlan, Candidate, Costs, Prediction
from chain.prepared import estimate
from chain.prepared.preparation import prepare
from chain.prepared.run_spec import RunSpec
from chain.schedule.schedules import Schedule

AUTO = "auto"


def is_auto(s: Settings) -> bool:
    """Whether the run's plan is chosen by measuring (`placement.plan=auto`)."""
    return s.placement.plan == AUTO


def is_gpt(s: Settings) -> bool:
    """Whether the stages are `model=gpt`'s transformer, cut as a model=keras file's model is."""
    return isinstance(s.stages[0].model, Gpt)


def is_cut_model(s: Settings) -> bool:
    """Whether the stages are one Keras model cut (model=keras)."""
    return isinstance(s.stages[0].model, KerasModel)


def chosen_settings(s: Settings, c: Candidate) -> Settings:
    """`s` with `c.overrides()` applied: K copies of the stage template (`+stages=K`), the pipeline's
    keys, the copies, the cut and the devices; checked again across keys, as a composed config is."""
    p = s.pipeline
    pipeline = replace(
        p,
        microbatches=c.microbatches,
        schedule=c.schedule,
        recompute=c.recompute,
        virtual_stages=c.virtual_stages,
    )
    placement = replace(s.placement, replicas=c.replicas if c.replicas > 1 else None, split=c.split, devices=c.devices)
    stages = (s.stages[0],) * c.stages
    return checks.settle(replace(s, stages=stages, pipeline=pipeline, placement=placement, notes=()), None)


def stage_range_costs(s: Settings, spec: RunSpec) -> Callable[[int, int], StageCost]:
    """A built-in model's stage cost by its (first, end) link range: its stages are the links (the
    config's shapes, `chain.prepared.estimate.stage_costs`)."""
    costs = estimate.stage_costs(s, spec.data_info)

    def of(a: int, b: int) -> StageCost:
        if b - a != 1 or costs[a] is None:
            raise ValueError("a built-in model's stages are its links")
        return costs[a]

    return of


def peaks_of(
    spec: RunSpec, costs: Costs, stage_cost: Callable[[int, int], StageCost]
) -> Callable[[Candidate, Schedule], Sequence[int]]:
    """Per candidate, each stage's estimated peak in bytes (`estimate.from_costs` on the candidate's
    settings and batch cut), stage k's cost from its layers (`stage_cost(first link, end link)`)."""
    s, batch = spec.settings, spec.settings.data.batch_size

    def peaks(c: Candidate, schedule: Schedule) -> list[int]:
        other = replace(
            s,
            stages=(s.stages[0],) * c.stages,
            pipeline=replace(
                s.pipeline,
                microbatches=c.microbatches,
                schedule=c.schedule,
                recompute=c.recompute,
                virtual_stages=c.virtual_stages,
            ),
        )
        cut = checks.batch_cut(batch, c.replicas, c.microbatches)
        bounds = _link_bounds(costs, c)
        stage_costs = [stage_cost(a, b) for a, b in zip(bounds, bounds[1:])]
        return [
            f.total if f is not None else 0
            for f in estimate.from_costs(other, spec.assignment, cut, stage_costs, schedule)
        ]

    return peaks


def _link_bounds(costs: Costs, c: Candidate) -> list[int]:
    """The candidate's stage bounds in links (its split is in layers)."""
    if c.split is None:
        return list(range(c.stages + 1))
    ends, total = [0], 0
    starts = [a for a, _ in costs.links]
    for n in c.split:
        total += n
        ends.append(starts.index(total) if total in starts else len(costs.links))
    return ends


def device_memory(spec: RunSpec, devices: Sequence[str]) -> dict[str, int | None]:
    """Each pool device's memory in bytes (a logical GPU's limit or its card's; None: unknown, as logical
    CPUs, whose shared memory the manual plan's check holds the chain to)."""
    mb = fit.device_memory_mb(spec.assignment, spec.inventory) if spec.inventory is not None else {}
    return {d: (mb[d] * fit.MB if mb.get(d) is not None else None) for d in devices}


def stage_counts(s: Settings, costs: Costs) -> list[int]:
    """The stage counts the search tries: a built-in model's own (its cut is fixed); a cut model's from
    1 up to its links and the pool times the most stages a searched schedule puts on a device
    (interleaved's and zbv's two: `search.per_device`)."""
    if costs.fixed_cut:
        return [len(s.stages)]
    return list(range(1, min(len(costs.links), search.per_device() * len(costs.devices)) + 1))


def choose(spec: RunSpec, costs: Costs, stage_cost: Callable[[int, int], StageCost] | None = None) -> AutoPlan:
    """The search on `costs` for `spec`'s model and global batch: every candidate predicted, those the
    memory estimate says do not fit their devices dropped (a ConfigError when none fits), best first."""
    s = spec.settings
    costs, stage_cost = _per_step(spec, costs, stage_cost)
    return search.search(
        costs,
        s.data.batch_size,
        stage_counts(s, costs),
        grad_accum=s.trainer.grad_accum,
        peaks=peaks_of(spec, costs, stage_cost),
        memory=device_memory(spec, costs.devices),
    )


def predict(
    spec: RunSpec, costs: Costs, c: Candidate, stage_cost: Callable[[int, int], StageCost] | None = None
) -> Prediction:
    """One given candidate's prediction for `spec` (as `choose` predicts each: its step, bubble, and each
    device's estimated peak against its memory), e.g. a benchmark's grid plan. A cut model's candidate
    gives its `split` (layers per stage, on the links' bounds); a built-in model's has none."""
    s = spec.settings
    costs, stage_cost = _per_step(spec, costs, stage_cost)
    return search.predict(
        costs,
        c,
        _link_bounds(costs, c),
        s.data.batch_size,
        grad_accum=s.trainer.grad_accum,
        peaks=peaks_of(spec, costs, stage_cost),
        memory=device_memory(spec, costs.devices),
    )


def _per_step(
    spec: RunSpec, costs: Costs, stage_cost: Callable[[int, int], StageCost] | None
) -> tuple[Costs, Callable[[int, int], StageCost]]:
    """What `choose` and `predict` read: the call's cost shared by the steps a call runs
    (`trainer.steps_per_call`), and the stage cost (a built-in model's from the config when none is given)."""
    s = spec.settings
    return (replace(costs, step_s=costs.step_s / s.trainer.steps_per_call), stage_cost or stage_range_costs(s, spec))


def chosen_spec(spec: RunSpec, plan: AutoPlan) -> RunSpec:
    """The `RunSpec` `prepare` makes for `spec`'s settings with the chosen candidate's overrides, on the
    same machine (`spec.inventory`), with `auto_plan` set."""
    return replace(prepare(chosen_settings(spec.settings, plan.chosen.candidate), spec.inventory), auto_plan=plan)
