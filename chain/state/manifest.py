"""The run-level checkpoint manifest, `checkpoint.json`: which step is complete, and what it holds.

A save writes every stage's checkpoint first and this file last, atomically (temporary
file + `os.replace`), so the manifest only ever names a step that every stage finished
saving. It also records the chain's *layout* (stage count, every layer's class and
variable shapes, heads, optimizers) so a restore into a differently built chain is a
clear error instead of a silent partial restore, and so a resume on another layout can map layers
between splits.

Format (`"format": 2`; format 1, without `run` and `digests`, is still read):

    run             the run's identity (a random id drawn at its first save, kept on resume)
    step            newest complete step; restore uses this one
    complete        complete steps still on disk, oldest first (the last is `step`)
    digests         {"STEP": {"stage_00": {"ckpt-STEP.index": sha256, ...}, ..., "data": {...}}}
                    for every complete step: what each file held when it was written
    mode, seed, data, grad_accum    what the data stream and random state depend on
    settings        every setting of the run (`chain.state.run_settings`), for reading: a resume
                    checks the copy recorded inside `data/ckpt-STEP`, which is verified
    precision       what the stages computed in (float16 checkpoints hold loss scales)
    stages          one entry per stage: index, dir, target, optimizer, layers, head
                    (layers: [{"class": "Dense", "variables": [["kernel", [64, 64]], ...]}])
    checkpoints     {"stage_00": "stage_00/ckpt-10", ..., "data": "data/ckpt-10"} (always `step`'s own files;
                    a manifest naming others, or whose `step` is not the last of `complete`, was
                    edited: `read` treats it as damaged, so it is rebuilt from the stage directories)
    loss_first      the first step's losses, {"loss": ..., "stage_losses": [...]} (kept across resumes)
    loss_last       the same at `step`
    validation      {"STEP": {"best_loss": ..., "best_step": ..., "evals_since_best": ...}} for every
                    complete step: what the run's evaluations had found by then (none: {"STEP": null})
"""

from __future__ import annotations

import json
import os
import re
from typing import Any, Sequence

from chain.config.schema import Settings, plain
from chain.errors import ChainError, CheckpointError, first_line
from chain.state.atomic import write_json

FORMAT = 2
READS = (1, 2)
FILENAME = "checkpoint.json"
REQUIRED = ("format", "step", "complete", "mode", "seed", "data", "stages", "checkpoints")
PREFIX = "ckpt"
NUMBERED = re.compile(rf"^{PREFIX}-(\d+)(\.index|\.data-\d+-of-\d+|_temp)$")  # a checkpoint's files
_PARTS = re.compile(r"^(stage_\d+|data)$")  # the directories a save writes


def path(run_dir: str) -> str:
    """Where the manifest of `run_dir` lives."""
    return os.path.join(run_dir, FILENAME)


def write(run_dir: str, manifest: dict[str, Any]) -> None:
    """Write the manifest atomically and durably: a reader sees the old file or the new one."""
    write_json(path(run_dir), manifest)


class ManifestDamaged(CheckpointError):
    """`checkpoint.json` exists but cannot be read as a manifest."""


def exists(run_dir: str) -> bool:
    """True when `run_dir` has a manifest file, readable or not."""
    return os.path.exists(path(run_dir))


def part_directories(run_dir: str) -> list[str]:
    """The part directories (`stage_NN`, `data`) in `run_dir`, sorted."""
    try:
        return sorted(e for e in os.listdir(run_dir) if _PARTS.match(e) and os.path.isdir(os.path.join(run_dir, e)))
    except OSError:
        return []


def checkpoint_files(run_dir: str) -> list[str]:
    """Checkpoint files in `run_dir`'s part directories (`stage_NN/`, `data/`), complete or not,
    as paths relative to it, sorted: what a run saved, with or without its manifest."""
    found = []
    try:
        parts = sorted(e for e in os.listdir(run_dir) if _PARTS.match(e))
    except OSError:
        return []
    for part in parts:
        try:
            found += [f"{part}/{f}" for f in sorted(os.listdir(os.path.join(run_dir, part))) if NUMBERED.match(f)]
        except OSError:  # not a directory
            continue
    return found


def require_none(run_dir: str) -> None:
    """A new run may not start where a checkpoint is (even a damaged one, or stage directories whose
    manifest is missing): a CheckpointError says so. A run's checkpoints are never overwritten."""
    if exists(run_dir):
        try:
            at = f" at step {read(run_dir)['step']}"
        except ManifestDamaged:
            at = " (its checkpoint.json is damaged)"
        raise CheckpointError(
            f"{run_dir} already holds a checkpoint{at}; pass resume=true to continue it, "
            "or choose another hydra.run.dir"
        )
    files = checkpoint_files(run_dir)
    if files:
        more = ", ..." if len(files) > 1 else ""
        raise CheckpointError(
            f"{run_dir} already holds checkpoints ({files[0]}{more}) but no {FILENAME}; pass "
            f"resume=true to continue it ({FILENAME} is rebuilt from them), or choose another "
            "hydra.run.dir"
        )


def require_some(run_dir: str) -> None:
    """`resume=true` needs a checkpoint (a damaged or missing manifest is rebuilt on restore from
    the stage directories, so their files count)."""
    if not exists(run_dir) and not checkpoint_files(run_dir):
        raise CheckpointError(
            f"resume=true, but {run_dir} has no complete checkpoint ({FILENAME} is missing); "
            "point hydra.run.dir at a run that saved one, or drop resume=true to start a new run"
        )


def read(run_dir: str) -> dict[str, Any] | None:
    """The manifest of `run_dir`, or None if it has none; `ManifestDamaged` if it cannot be read."""
    where = path(run_dir)
    try:
        with open(where, "rb") as f:
            text = f.read()
    except FileNotFoundError:
        return None
    except OSError as e:
        raise ManifestDamaged(f"{where} cannot be read: {e.strerror or e}") from None
    try:
        manifest = json.loads(text.decode())
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        what = "is empty" if not text.strip() else f"is not valid JSON ({first_line(e, typed=False)})"
        raise ManifestDamaged(f"{where} {what}") from None
    if not isinstance(manifest, dict) or any(k not in manifest for k in REQUIRED):
        missing = next((k for k in REQUIRED if not isinstance(manifest, dict) or k not in manifest), "?")
        raise ManifestDamaged(f"{where} is not a checkpoint manifest (no {missing!r})")
    if manifest["format"] not in READS:
        raise ManifestDamaged(
            f"{where} has format {manifest['format']!r}; this version reads formats {', '.join(map(str, READS))}"
        )
    if (
        not isinstance(manifest["step"], int)
        or not isinstance(manifest["complete"], list)
        or manifest["step"] not in manifest["complete"]
    ):
        raise ManifestDamaged(
            f"{where} is inconsistent: step {manifest['step']!r} is not among the complete "
            f"steps {manifest['complete']!r}"
        )
    # A save names its own step's files and commits the newest step: anything else was edited.
    step = manifest["step"]
    if manifest["complete"][-1] != step:
        raise ManifestDamaged(
            f"{where} is inconsistent: step {step} is not the newest of the complete steps {manifest['complete']}"
        )
    for part, named in manifest["checkpoints"].items() if isinstance(manifest["checkpoints"], dict) else ():
        if named != f"{part}/{PREFIX}-{step}":
            raise ManifestDamaged(f"{where} is inconsistent: it names {named} for {part} at step {step}")
    if not isinstance(manifest["checkpoints"], dict):
        raise ManifestDamaged(f"{where} is inconsistent: its checkpoints are not a mapping")
    return manifest


def _layers(model) -> list[dict[str, Any]]:
    return [
        {"class": type(layer).__name__, "variables": [[v.name, list(v.shape)] for v in layer.weights]}
        for layer in model.layers
    ]


def layout(stages: Sequence) -> list[dict[str, Any]]:
    """What a checkpoint of `stages` must be restored into: per stage, layers and head."""
    from chain.stages.fused import kind as optimizer_kind

    return [
        {
            "index": s.index,
            "target": s.target.name,
            "optimizer": optimizer_kind(s.optimizer),
            "layers": _layers(s.model),
            "head": _layers(s.head) if s.head is not None else None,
        }
        for s in stages
    ]


def split(stages: list[dict[str, Any]]) -> list[int]:
    """Layers per stage of a layout (`layout`), input layers left out."""
    return [sum(layer["class"] != "InputLayer" for layer in s["layers"]) for s in stages]


def _describe(layer: dict[str, Any]) -> str:
    shapes = ", ".join(f"{name} {tuple(shape)}" for name, shape in layer["variables"])
    return f"{layer['class']}" + (f" ({shapes})" if shapes else "")


def _compare_layers(where: str, saved: list[dict], built: list[dict]) -> None:
    for i in range(max(len(saved), len(built))):
        if i >= len(built):
            raise ChainError(f"{where}: layers[{i}] {_describe(saved[i])} is in the checkpoint but not in the config")
        if i >= len(saved):
            raise ChainError(f"{where}: layers[{i}] {_describe(built[i])} is in the config but not in the checkpoint")
        a, b = saved[i], built[i]
        if a["class"] != b["class"]:
            raise ChainError(f"{where}: layers[{i}] is {a['class']} in the checkpoint but {b['class']} in the config")
        names_a = [n for n, _ in a["variables"]]
        names_b = [n for n, _ in b["variables"]]
        if names_a != names_b:
            raise ChainError(
                f"{where}: layers[{i}] {a['class']} has variables {names_a} in the checkpoint "
                f"but {names_b} in the config"
            )
        for (name, sa), (_, sb) in zip(a["variables"], b["variables"]):
            if list(sa) != list(sb):
                raise ChainError(
                    f"{where}: variable layers[{i}] {a['class']} {name} has shape {tuple(sa)} "
                    f"in the checkpoint but {tuple(sb)} in the config"
                )


def check_layout(saved: list[dict[str, Any]], built: list[dict[str, Any]]) -> None:
    """Raise a one-line ChainError naming the first stage and variable where two layouts differ."""
    if len(saved) != len(built):
        raise ChainError(
            f"the checkpoint has {len(saved)} stages but the config builds {len(built)}; "
            f"use +stages={len(saved)} as the run that wrote it did (another stage count regroups a cut model "
            "or the chain's own mlp/conv stages, not stages of your own models)"
        )
    for a, b in zip(saved, built):
        where = f"checkpoint does not match the config at stage {b['index']}"
        _compare_layers(where, a["layers"], b["layers"])
        if (a["head"] is None) != (b["head"] is None):
            has = "has" if a["head"] is not None else "has no"
            raise ChainError(f"{where}: the checkpoint {has} head for this stage (different mode?)")
        if a["head"] is not None:
            _compare_layers(f"{where} (head)", a["head"], b["head"])
        if a["optimizer"] != b["optimizer"]:
            raise ChainError(
                f"{where}: the optimizer is {a['optimizer']} in the checkpoint but {b['optimizer']} in the config"
            )


def check_stream(manifest: dict[str, Any], settings: Settings) -> None:
    """The data stream and random state continue exactly only with the same mode, seed and data."""
    for key in ("mode", "seed"):
        if manifest[key] != getattr(settings, key):
            raise ChainError(
                f"the checkpoint was written with {key}={manifest[key]!r}, the config has "
                f"{key}={getattr(settings, key)!r}; resume needs the same {key}"
            )
    saved, now = manifest["data"], plain(settings.data)
    for key in sorted(set(saved) | set(now)):
        if saved.get(key) != now.get(key):
            raise ChainError(
                f"the checkpoint was written with data.{key}={saved.get(key)!r}, the config has "
                f"data.{key}={now.get(key)!r}; the data stream continues only with the same data settings"
            )
    # Each saved iterator position is a step's worth of batches: grad_accum x batch_size examples.
    saved_n, now_n = manifest.get("grad_accum", 1), settings.trainer.grad_accum
    if saved_n != now_n:
        raise ChainError(
            f"the checkpoint was written with trainer.grad_accum={saved_n}, the config has "
            f"trainer.grad_accum={now_n}; resume needs the same trainer.grad_accum"
        )
    check_precision(manifest, settings)


def check_precision(manifest: dict[str, Any], settings: Settings) -> None:
    """float32 and mixed_bfloat16 checkpoints hold the same state and resume into each other;
    mixed_float16 ones also hold loss scales, so float16 resumes only from float16."""
    saved, now = manifest.get("precision", "float32"), settings.precision
    if saved != now and "mixed_float16" in (saved, now):
        raise ChainError(
            f"the checkpoint was written with precision={saved}, the config has precision={now}; "
            "mixed_float16 checkpoints hold loss scales, so resume float16 runs with precision=mixed_float16 "
            "and others without it"
        )
