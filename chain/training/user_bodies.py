"""Which stages the config's own `mlp`/`conv` do not build, and what builds them instead:
builders from the config (`_target_`) or the Python API (`chain.build(cfg, stages=[...])`),
or the pieces of one Keras model cut into stages (`model=keras`, or `chain.build(cfg, model=...)`).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Callable, NamedTuple, Sequence

import keras

from chain.config.checks import BatchCut
from chain.config.schema import Builder, Gpt, KerasModel, Settings
from chain.config.shapes import human, optimizer_slots
from chain.data.catalog import DataInfo
from chain.errors import ConfigError
from chain.schedule.schedules import Schedule
from chain.planning import balance, footprint
from chain.planning.planner import MIRRORED, Assignment
from chain.stages import cut, named_inputs
from chain.prepared import estimate
from chain.stages.bodies import Body, from_builder
from chain.stages.user_model import gpt_model, load_model
from chain.strategies.objectives import objective


def _refuse_softmax(c: cut.Cuttable, settings: Settings) -> None:
    last = c.layers[-1]
    activation = getattr(getattr(last, "activation", None), "__name__", "")
    if (
        settings.mode == "e2e"
        and settings.loss == "sparse_categorical_crossentropy"
        and (activation == "softmax" or isinstance(last, keras.layers.Softmax))
    ):
        raise ConfigError(
            f"{c.name} ends in a softmax ({last.name!r}), but the chain's cross-entropy takes logits: "
            "remove the softmax from the model (the chain's predictions are then its logits)"
        )


class Resolved(NamedTuple):
    """What `resolve` found: the stage bodies not built from the config's own models (None where a stage
    is; None: every stage is), their labels for the placement table, and the placement with what a cut
    model adds (its stages' footprints, the balance's notes): a new record, the one given unchanged."""

    bodies: list[Body | None] | None
    labels: list[str | None] | None
    assignment: Assignment


def _cut(
    settings: Settings,
    assignment: Assignment,
    info: DataInfo,
    model: keras.Model,
    name: str,
    batch_cut: BatchCut,
    schedule: Schedule | None,
) -> tuple[list[Body], list[str], Assignment]:
    if settings.data.packed:  # windows of several examples: the model takes the token and segment ids by name
        named_inputs.check_packed(model, name)
    c = cut.analyse(model, name)
    # A model with several inputs (a dict, as keras_hub's) takes its batches from `Run.step(x_dict, y)`:
    # the config's data set has one input array, so there is nothing to fit it to.
    if len(c.boundary[0]) == 1 and not cut.fits(c.input_shape, info.input_shape):
        any_size = " (None: any size)" if None in c.input_shape else ""
        raise ConfigError(
            f"{name} takes input of shape {c.input_shape}{any_size}, but data={info.name} examples have "
            f"shape {tuple(info.input_shape)}"
        )
    _refuse_softmax(c, settings)
    k, p = len(settings.stages), settings.placement
    # mode=local's head reads its stage's output, one tensor: of several crossing a cut none is the stage's alone
    learns = objective(settings.mode)
    one_tensor = f"mode={settings.mode}" if learns.heads and learns.chained else None
    costs = None
    if p.balance == "time" and p.split is None:
        from chain.stages.examples import feed
        from chain.stages.timing import link_times

        devices = (
            [assignment.local_mirrored_devices[0]] * k if assignment.topology == MIRRORED else list(assignment.devices)
        )
        measured = link_times(
            c,
            devices,
            assignment.physical,
            batch_cut.per_microbatch,
            feed(settings, info, c.layers),
            progress=settings.trainer.progress,
            several=one_tensor is None,
        )
        costs = [measured.layer_costs(d) for d in devices]
    if p.balance == "memory" and p.split is None:
        played = estimate.schedule_played(settings, assignment, schedule)
        costs = footprint.layer_costs(
            c.params(),
            c.outputs(),
            estimate.held(settings, played),
            slots=optimizer_slots(settings.stages[0].optim),
            microbatch=batch_cut.per_microbatch,
            recompute=settings.pipeline.recompute if played is not None else footprint.NEVER,
        )
    sizes = cut.split(c, k, p.split, p.balance, costs, one_tensor)
    footprints = tuple(_footprints(c, sizes, settings, assignment, batch_cut, schedule))
    note = _balance_note(c, sizes, costs, footprints, settings, assignment, batch_cut, schedule)
    bounds = [0, *balance.sizes_to_cuts(sizes), len(c.layers)]
    labels = [cut.describe(c, a, b) for a, b in zip(bounds, bounds[1:])]
    return cut.pieces(c, sizes), labels, replace(assignment, footprints=footprints).noted(*([note] if note else []))


def _balance_note(
    c: cut.Cuttable,
    sizes: list[int],
    costs: list[list[float]] | None,
    footprints: Sequence[footprint.Footprint | None],
    settings: Settings,
    assignment: Assignment,
    batch_cut: BatchCut,
    schedule: Schedule | None,
) -> str | None:
    """The placement table's note on the split `placement.balance` chose (`sizes`, from `costs`: None
    unless timed or estimated) beside the even split's; None when there is nothing to show."""
    k, p = len(settings.stages), settings.placement
    try:
        even = cut.split(c, k, None, "even", None)  # what placement.balance=even would cut
    except ConfigError:  # a given split with a stage that holds no weights: balancing has none to show
        even = None
    if p.balance == "memory" and p.split is None:

        def peaks(footprints):
            return " / ".join(human(f.total) for f in footprints)

        return (
            f"placement.balance=memory: split {sizes}: estimated peaks {peaks(footprints)}; "
            f"the even split {even}: {peaks(_footprints(c, even, settings, assignment, batch_cut, schedule))}"
        )
    if even is None or (costs is None and p.balance != "params"):
        return None
    rows = costs or [[float(n) for n in c.params()]] * k

    def show(s):
        per = balance.stage_costs(rows, s)
        if costs is None:
            return " / ".join(f"{int(v):,}" for v in per) + " parameters"
        return (
            " / ".join(f"{v * 1e3:.3g}" for v in per) + f" ms per microbatch; predicted step "
            f"{balance.predicted_step(per, batch_cut.microbatches) * 1e3:.3g} ms"
        )

    return f"placement.balance={p.balance}: split {sizes}: {show(sizes)}; the even split {even}: {show(even)}"


def _footprints(
    c: cut.Cuttable,
    sizes: Sequence[int],
    settings: Settings,
    assignment: Assignment,
    batch_cut: BatchCut,
    schedule: Schedule | None,
) -> list[footprint.Footprint | None]:
    """Each stage's estimated peak for a cut of `c` into `sizes` layers per stage (`chain.planning.footprint`)."""
    bounds = [0, *balance.sizes_to_cuts(sizes), len(c.layers)]
    params, outputs = c.params(), c.outputs()
    costs = [
        footprint.StageCost(sum(params[a:b]), sum(outputs[a:b]), c.crossing(a), c.crossing(b), max(params[a:b]))
        for a, b in zip(bounds, bounds[1:])
    ]
    return estimate.from_costs(settings, assignment, batch_cut, costs, schedule)


def resolve(
    settings: Settings,
    assignment: Assignment,
    info: DataInfo,
    batch_cut: BatchCut,
    stages: Sequence[Callable] | None = None,
    model: keras.Model | None = None,
    schedule: Schedule | None = None,
) -> Resolved:
    """Stage bodies not built from the config's own models (None where a stage is), their labels for the
    placement table, and the placement with a cut model's footprints and notes (balance): `Resolved`.
    `batch_cut` and `schedule`: the run's (`RunSpec.batch_cut`, `RunSpec.schedule`), which a cut model's
    timing and estimate read."""
    k = len(settings.stages)
    p = settings.placement
    keras_spec = settings.stages[0].model if isinstance(settings.stages[0].model, KerasModel) else None
    gpt_spec = settings.stages[0].model if isinstance(settings.stages[0].model, Gpt) else None
    if (p.split is not None or p.balance != "even") and model is None and keras_spec is None and gpt_spec is None:
        key = "placement.split" if p.split is not None else f"placement.balance={p.balance}"
        raise ConfigError(
            f"{key} cuts one model into stages: it needs model=keras model.path=FILE.keras, model=gpt "
            "(or chain.build(cfg, model=...))"
        )
    if stages is not None:
        if model is not None:
            raise ConfigError("chain.build takes stages=[...] or model=..., not both")
        if len(stages) != k:
            raise ConfigError(
                f"chain.build got {len(stages)} stage builders, but the config has {k} stages (+stages={len(stages)})"
            )
        names = [getattr(fn, "__qualname__", type(fn).__name__) for fn in stages]
        return Resolved(
            [from_builder(fn, None, f"stage builder {n}") for fn, n in zip(stages, names)], names, assignment
        )
    if gpt_spec is not None and stages is None and model is None:  # the built-in transformer, cut as a file's model
        return Resolved(*_cut(settings, assignment, info, gpt_model(settings), "model=gpt", batch_cut, schedule))
    if model is not None or keras_spec is not None:
        name = keras_spec.path if model is None else (model.name or "model")
        return Resolved(
            *_cut(
                settings,
                assignment,
                info,
                model if model is not None else load_model(keras_spec),
                name,
                batch_cut,
                schedule,
            )
        )
    if not any(isinstance(s.model, Builder) for s in settings.stages):
        return Resolved(None, None, assignment)
    bodies, labels = [], []
    for i, s in enumerate(settings.stages):
        if isinstance(s.model, Builder):
            bodies.append(from_builder(s.model.target, s.model.kwargs, f"stages[{i}].model._target_={s.model.target}"))
            labels.append(s.model.describe())
        else:
            bodies.append(None)
            labels.append(None)
    return Resolved(bodies, labels, assignment)
