"""Re-staging offline (`python -m chain.restage SRC DST +stages=K`): a resume on another stage count
(`chain.state.by_layer`, what `python -m chain ... +stages=K resume=true` does in place), written into
another run directory instead of continuing.

The DST config is SRC's (its `.hydra/overrides.yaml`) with the given overrides on top.
`+stages=K` alone re-splits a homogeneous chain evenly (4 stages of depth 2 -> 2 of
depth 4: `model.depth` is derived); otherwise give the depths yourself. DST's stages are built on
the CPU and restored from SRC's newest complete step as a resume would restore them (weights,
optimizer slots, counters, dropout seed state, the data stream; the heads of mode=local kept where
both splits end a stage, new ones fresh), then saved with the same all-or-nothing protocol as
training, and `python -m chain hydra.run.dir=DST resume=true <overrides>` continues (the printed
command trains on: a SRC that had reached its `trainer.steps` gets `trainer.steps` of that step plus
as many again).
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
from chain.records.results import LossHistory
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
    built = _built_on_cpu(dst_settings, dataset.info)
    files = stamps(dataset.shards) if dataset.shards is not None else None  # streamed: as SRC recorded them
    read = Checkpoints(src, built, iterator, dst_settings, files=files)
    m = read.restore(clean=False)  # as a resume on the new split restores it; SRC is read, never changed
    losses = from_json(LossHistory, m)
    lock.acquire(dst)  # created here if missing; no other run may write into it meanwhile
    try:
        with writing(f"the re-staged run in {dst}"):
            os.makedirs(os.path.join(dst, ".hydra"), exist_ok=True)
            OmegaConf.save(OmegaConf.create(new), os.path.join(dst, ".hydra", "overrides.yaml"))
            OmegaConf.save(dst_settings.source, os.path.join(dst, ".hydra", "config.yaml"))
            Checkpoints(dst, built, iterator, dst_settings, files=files).save(
                m["step"], losses.loss_first, losses.loss_last
            )
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
        "src_stages": len(src_settings.stages),
        "dst_stages": len(built),
        "overrides": new,
        "heads": read.regrouped.lines("SRC stage"),
        "resume_command": shlex.join(resume),
    }
