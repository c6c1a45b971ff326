"""Re-staging: the same layers, split into a different number of stages (`python -m chain.restage`).

Layers are the unit of a chain and stages are groups of layers, so a checkpoint of one
split can be mapped onto another layer by layer: weights, optimizer slots (Adam's
moments, SGD's momentum), dropout seed-generator state, and the data stream all carry
over, and `python -m chain hydra.run.dir=DST resume=true <overrides>` continues
training from SRC's newest complete step (the printed command trains on: a SRC that had
reached its `trainer.steps` gets `trainer.steps` of that step plus as many again).

The DST config is SRC's (its `.hydra/overrides.yaml`) with the given overrides on top.
`+stages=K` alone re-splits a homogeneous chain evenly (4 stages of depth 2 -> 2 of
depth 4: `model.depth` is derived); otherwise give the depths yourself.

Heads (mode=local: each stage has a linear head on its own output). A head whose
input is a point where both splits end a stage, and that learns the same target, is
kept with its optimizer state; heads at points that stop being a stage boundary are
dropped; heads at new boundaries start fresh (initialised from the seed, optimizer
state zero). The last stage's head always survives, so the chain's prediction and
every stage body output at a shared boundary are unchanged.

Optimizer iteration counts: a DST stage takes the largest count among the SRC stages
it draws layers from (they are equal unless `trainer.on_nan=skip` dropped updates).
"""

from __future__ import annotations

import os
import shlex
from typing import Any, Sequence

from omegaconf import OmegaConf

from chain.config import Settings, compose, override_key, validate
from chain.config.checks import steps as target_steps
from chain.config.hydra import quoted
from chain.config.schema import Conv, Mlp
from chain.errors import ChainError
from chain.internals.keras_private import built_for, slot_lists
from chain.records.results import LossHistory, LossRecord
from chain.records.serial import from_json
from chain.state import lock
from chain.state import manifest as manifest_lib
from chain.state.atomic import writing


def _stage_count(overrides: Sequence[str]) -> int | None:
    for o in overrides:
        if override_key(o) == "stages":
            value = o.partition("=")[2].strip()
            return int(value) if value.lstrip("-").isdigit() else None
    return None


def dst_overrides(src_overrides: Sequence[str], new: Sequence[str], src_settings: Settings) -> list[str]:
    """SRC's overrides with `new` on top; derives `model.depth` when only the stage count changes.

    Raises ChainError when an even split is asked for but impossible.
    """
    new = list(new)
    k_new = _stage_count(new)
    if k_new is not None:
        compose([f"+stages={k_new}"])  # the count alone must be valid (a ConfigError names it)
    specs = src_settings.stages
    sets_model = any(override_key(o) in ("model", "model.depth") or override_key(o).startswith("stage.") for o in new)
    if k_new is not None and not sets_model and k_new != len(specs):
        if any(s.model != specs[0].model for s in specs):
            raise ChainError("SRC has stages with different models; give the new split explicitly with +stages=[...]")
        total = specs[0].model.depth * len(specs)
        if total % k_new:
            raise ChainError(
                f"cannot split {len(specs)} stages of model.depth={specs[0].model.depth} ({total} blocks) "
                f"evenly into {k_new} stages; choose a stage count that divides {total}, "
                "or give the depths with +stages=[...]"
            )
        new.append(f"model.depth={total // k_new}")
    replaced = {override_key(o) for o in new}
    kept = [
        o
        for o in src_overrides
        if override_key(o) not in replaced and override_key(o) != "resume" and not override_key(o).startswith("hydra.")
    ]
    return kept + new


def continuing(overrides: list[str], step: int, target: int | None, decay_steps: int | None = None) -> list[str]:
    """`overrides` made to train on from `step`: a SRC that had reached its target (`trainer.steps`, or
    what `trainer.epochs` makes) would resume to it and train 0 steps, so the target moves to `step`
    plus that many steps (another run as long as SRC's); a target still ahead is kept. `decay_steps`:
    the learning-rate schedule's end that `optim.decay_steps=null` settled to the old target, kept
    as it is (the checkpoint recorded it; a resume refuses another)."""
    if target is None or step < target:
        return overrides
    kept = [o for o in overrides if override_key(o) not in ("trainer.steps", "trainer.epochs")]
    pinned = (
        [f"optim.decay_steps={decay_steps}"]
        if decay_steps is not None and not any(override_key(o) == "optim.decay_steps" for o in overrides)
        else []
    )
    return [*kept, f"trainer.steps={step + target}", *pinned]


def _load_src(src: str) -> tuple[dict[str, Any], list[str], Settings]:
    m = manifest_lib.read(src)
    if m is None:
        raise ChainError(f"{src} has no complete checkpoint ({manifest_lib.FILENAME} is missing)")
    hydra_dir = os.path.join(src, ".hydra")
    if not os.path.isfile(os.path.join(hydra_dir, "config.yaml")):
        raise ChainError(
            f"{hydra_dir}/config.yaml is missing: restage needs a run directory written by python -m chain"
        )
    cfg = OmegaConf.load(os.path.join(hydra_dir, "config.yaml"))
    overrides_file = os.path.join(hydra_dir, "overrides.yaml")
    overrides = list(OmegaConf.load(overrides_file)) if os.path.isfile(overrides_file) else []
    return m, [str(o) for o in overrides], validate(cfg)


def _slot_lists(optimizer) -> dict[str, list]:
    """Slot variables of a Keras optimizer by slot kind, aligned with the variables it was built for.

    Keras 3 keeps them as private lists parallel to the variables it was built for
    (`chain.internals.keras_private.slot_lists`); we refuse an optimizer with state we do not
    recognise rather than drop it silently.
    """
    slots = slot_lists(optimizer)
    known = {id(v) for lst in slots.values() for v in lst} | {id(optimizer.iterations), id(optimizer.learning_rate)}
    unknown = [v.path for v in optimizer.variables if id(v) not in known]
    if unknown:
        raise ChainError(f"cannot map optimizer state of {optimizer.name}: unrecognised variables {unknown}")
    return slots


class _Copier:
    """Copies weights, their optimizer slots and random state from SRC layers to DST layers."""

    def __init__(self, src_stages: Sequence, dst_stages: Sequence):
        self.src_slots = {s.index: _slot_lists(s.optimizer) for s in src_stages}
        self.dst_slots = {s.index: _slot_lists(s.optimizer) for s in dst_stages}

    def copy(self, src_stage, src_layer, dst_stage, dst_layer) -> None:
        from chain.stages.fused import kind
        from chain.stages.stage import random_variables

        if set(self.src_slots[src_stage.index]) != set(self.dst_slots[dst_stage.index]):
            raise ChainError(
                f"DST stage {dst_stage.index} uses {kind(dst_stage.optimizer)}, SRC stage "
                f"{src_stage.index} {kind(src_stage.optimizer)} with different state; "
                "restage keeps optimizer state, so keep the optimizers"
            )
        src_index = {id(v): i for i, v in enumerate(built_for(src_stage.optimizer))}
        dst_index = {id(v): i for i, v in enumerate(built_for(dst_stage.optimizer))}
        for a, b in zip(src_layer.weights, dst_layer.weights):
            b.assign(a)
            if id(a) in src_index and id(b) in dst_index:
                for kind, src_list in self.src_slots[src_stage.index].items():
                    self.dst_slots[dst_stage.index][kind][dst_index[id(b)]].assign(src_list[src_index[id(a)]])
        for a, b in zip(random_variables(src_layer), random_variables(dst_layer)):
            b.assign(a)


def _copy_loss_scale(sources: Sequence, dst) -> None:
    """precision=mixed_float16: DST's loss scale continues from its SRC stages'.

    In mode=e2e they are all equal (one scale for the chain); in mode=local the
    smallest wins (it overflowed most recently, so it is the safe one), with its
    finite-step count; the overflow count is the largest, as for `skipped`.
    """
    if dst.loss_scale is None:
        return
    scales = [s.loss_scale for s in sources]
    smallest = min(scales, key=lambda ls: float(ls.scale.numpy()))
    dst.loss_scale.scale.assign(smallest.scale)
    dst.loss_scale.good_steps.assign(smallest.good_steps)
    dst.loss_scale.overflows.assign(max(int(ls.overflows.numpy()) for ls in scales))


def _signature(layer) -> tuple:
    return type(layer).__name__, tuple(tuple(w.shape) for w in layer.weights)


def map_stages(src_stages: Sequence, dst_stages: Sequence) -> tuple[list[str], dict[int, int]]:
    """Copy SRC's state into DST's stages layer by layer.

    Returns one line per DST head saying what happened to it, and the kept heads as
    {DST stage: SRC stage}.
    Raises ChainError naming the first layer where the two chains differ.
    """
    src_layers = [(s, layer) for s in src_stages for layer in s.model.layers]
    dst_layers = [(s, layer) for s in dst_stages for layer in s.model.layers]
    if len(src_layers) != len(dst_layers):
        raise ChainError(
            f"SRC has {len(src_layers)} layers, the new split builds {len(dst_layers)}; "
            "restage regroups the same layers, so the total depth must stay the same"
        )
    for i, ((s, a), (d, b)) in enumerate(zip(src_layers, dst_layers)):
        if _signature(a) != _signature(b):
            raise ChainError(
                f"layer {i} (SRC stage {s.index}, DST stage {d.index}) is {_signature(a)[0]} with shapes "
                f"{list(_signature(a)[1])} in SRC but {_signature(b)[0]} with shapes {list(_signature(b)[1])} "
                "in the new split"
            )
    copier = _Copier(src_stages, dst_stages)
    sources: dict[int, set] = {d.index: set() for d in dst_stages}
    for (s, a), (d, b) in zip(src_layers, dst_layers):
        copier.copy(s, a, d, b)
        sources[d.index].add(s.index)

    # Heads: keyed by the layer count where their stage ends.
    def ends(stages):
        out, n = {}, 0
        for st in stages:
            n += len(st.model.layers)
            out[n] = st
        return out

    src_ends, notes, kept = ends(src_stages), [], {}
    for end, d in ends(dst_stages).items():
        if d.head is None:
            continue
        s = src_ends.get(end)
        if s is not None and s.head is not None and s.target.name == d.target.name:
            for a, b in zip(s.head.layers, d.head.layers):
                copier.copy(s, a, d, b)
            sources[d.index].add(s.index)
            kept[d.index] = s.index
            notes.append(f"stage {d.index}: head of SRC stage {s.index} kept ({d.target.name})")
        else:
            notes.append(f"stage {d.index}: new head ({d.target.name}), fresh weights and optimizer state")
    by_index = {s.index: s for s in src_stages}
    for d in dst_stages:
        d.optimizer.iterations.assign(max(int(by_index[k].optimizer.iterations.numpy()) for k in sources[d.index]))
        d.skipped.assign(max(int(by_index[k].skipped.numpy()) for k in sources[d.index]))
        _copy_loss_scale([by_index[k] for k in sorted(sources[d.index])], d)
    dropped = sorted(s.index for s in src_stages if s.head is not None and s.index not in kept.values())
    if dropped:
        notes.append("heads of SRC stages " + ", ".join(map(str, dropped)) + " dropped (no longer at a stage boundary)")
    return notes, kept


def restage(src: str, dst: str, overrides: Sequence[str] = ()) -> dict[str, Any]:
    """Write into `dst` a checkpoint of `src`'s newest complete step, re-split by `overrides`.

    Builds both chains on one device (restaging needs no parallelism), restores SRC
    without modifying it, maps every layer's state across, and saves DST with the
    same all-or-nothing protocol as training. Returns a report with the DST overrides,
    the step, what happened to each head, and the command that resumes DST.
    The lock of SRC is held while it is read (`lock.reading`): a run still training SRC is
    refused in one line.
    """
    src, dst = os.path.abspath(src), os.path.abspath(dst)
    pinned = f"hydra.run.dir={quoted(dst, 'hydra.run.dir')}"  # the resume command's, checked before writing
    if src == dst:
        raise ChainError("SRC and DST must be different run directories")
    if os.path.exists(dst) and not os.path.isdir(dst):
        raise ChainError(f"{dst} is a file; DST must be a run directory (a new one, or an empty one)")
    with lock.reading(src):  # a run still training SRC is refused: its files may be half-written
        return _restage(src, dst, overrides, pinned)


def _refuse_unregroupable(src_settings: Settings) -> None:
    """One line when SRC is not one chain of the chain's own mlp/conv stages (restage regroups only those)."""
    from chain.strategies.objectives import objective

    if not objective(src_settings.mode).chained:
        raise ChainError(
            f"mode={src_settings.mode} trains independent models, not one chain: restage regroups the "
            "layers of a chain's stages; there is nothing to regroup"
        )
    for k, spec in enumerate(src_settings.stages):
        if not isinstance(spec.model, (Mlp, Conv)):
            raise ChainError(
                f"SRC stage {k} is {spec.model.describe()}, a user model: restage regroups the layers "
                "of the chain's own mlp/conv stages and cannot re-cut it; for a cut Keras model, start "
                "a new run with another placement.split"
            )


def _built_on_cpu(s: Settings, info: Any) -> list:
    """`s`'s stages built on the CPU as the mode's strategy builds them (heads, read-out), seeded as a
    fresh run's (new heads start as a fresh DST run's would)."""
    import keras

    from chain.stages.assemble import build_stages
    from chain.strategies.objectives import objective

    keras.utils.set_random_seed(s.seed)
    kind = objective(s.mode)
    return build_stages(
        s.stages,
        ["/device:CPU:0"] * len(s.stages),
        info,
        heads=kind.heads,
        readout=kind.readout,
        precision_name=s.precision,
        initial_loss_scale=s.trainer.initial_loss_scale,
    )


def _restage(src: str, dst: str, overrides: Sequence[str], pinned: str) -> dict[str, Any]:
    from chain import data as data_lib
    from chain.data.identity import stamps
    from chain.data.stream import training_batches
    from chain.state.checkpoints import Checkpoints

    src_manifest, src_overrides, src_settings = _load_src(src)
    _refuse_unregroupable(src_settings)
    if manifest_lib.exists(dst):
        raise ChainError(f"{dst} already holds a checkpoint; choose an empty DST run directory")
    new = dst_overrides(src_overrides, overrides, src_settings)
    dst_settings = compose(new)
    manifest_lib.check_stream(src_manifest, dst_settings)

    dataset = data_lib.load(src_settings.data, src_settings.seed)
    iterator = iter(
        training_batches(dataset, src_settings.examples_per_step, src_settings.data.shuffle, src_settings.seed)
    )
    built = {name: _built_on_cpu(s, dataset.info) for name, s in (("src", src_settings), ("dst", dst_settings))}
    files = stamps(dataset.shards) if dataset.shards is not None else None  # streamed: as SRC recorded them
    src_ckpts = Checkpoints(src, built["src"], iterator, src_settings, files=files)
    m = src_ckpts.restore(clean=False)  # SRC is read, never changed
    notes, kept = map_stages(built["src"], built["dst"])
    losses = from_json(LossHistory, m)
    first, last = (
        _restaged_losses(record, kept, len(built["dst"]), dst_settings.mode)
        for record in (losses.loss_first, losses.loss_last)
    )
    lock.acquire(dst)  # created here if missing; no other run may write into it meanwhile
    try:
        with writing(f"the re-staged run in {dst}"):
            os.makedirs(os.path.join(dst, ".hydra"), exist_ok=True)
            OmegaConf.save(OmegaConf.create(new), os.path.join(dst, ".hydra", "overrides.yaml"))
            OmegaConf.save(dst_settings.source, os.path.join(dst, ".hydra", "config.yaml"))
            Checkpoints(dst, built["dst"], iterator, dst_settings, files=files).save(m["step"], first, last)
    finally:
        lock.release(dst)
    shown = [f"+stages={o.partition('=')[2]}" if override_key(o) == "stages" else o for o in new]
    template = dst_settings.optim  # its schedule's end, when decay_steps=null made it the old target
    decay = (
        dst_settings.stages[0].optim.decay_steps
        if template.schedule != "constant" and template.decay_steps is None
        else None
    )
    resume = ["python", "-m", "chain", pinned, "resume=true"] + continuing(
        shown, m["step"], target_steps(dst_settings, dataset.info), decay
    )
    return {
        "step": m["step"],
        "src_stages": len(built["src"]),
        "dst_stages": len(built["dst"]),
        "overrides": new,
        "heads": notes,
        "resume_command": shlex.join(resume),
    }


def _restaged_losses(record: LossRecord | None, kept: dict[int, int], n_stages: int, mode: str) -> LossRecord | None:
    """A manifest's loss record mapped onto the new stages.

    A kept head keeps its stage's loss; mode=e2e keeps the chain's loss (the chain is
    the same function); mode=local's sum over stages no longer means anything.
    """
    if record is None:
        return None
    stage_losses = record.stage_losses or []
    return LossRecord(
        record.loss if mode == "e2e" else None,
        [stage_losses[kept[k]] if k in kept and kept[k] < len(stage_losses) else None for k in range(n_stages)]
        if stage_losses
        else [],
    )
