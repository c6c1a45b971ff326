"""What a run was trained with, as its checkpoints record it, and what a resume may change.

Every checkpoint holds the settings of the run that wrote it (`RunSettings`, in its record:
`chain.state.checkpoints.Record`, in `data/ckpt-N`, whose digest the save records like every
other file's), so the check on resume reads settings that were verified with the weights, not
`checkpoint.json`, which may be torn (and rebuilt) or edited. A resume compares them with
its own config (`check`), key by key:

- may change, applied from the resumed step with a `note:` line (it changes the math):
  `optim.lr` (the restored optimizer's learning rate is replaced), `optim.beta_1`/`beta_2`
  (Adam), `optim.momentum` (SGD, between non-zero values: a momentum of 0 keeps no slots to
  continue), `precision` between float32 and mixed_bfloat16 (the same state);
- may change without a word (not the math): the run's length, log/evaluation/checkpoint
  cadence, steps per call (bit for bit the same), `trainer.on_nan`, early stopping's
  patience, profiling, the stall watch (`trainer.stall_s`, `trainer.stall_action`), devices and memory limits, cluster addresses, `checkpoint.*`, `oom.*`,
  `pipeline.recompute` (what a stage keeps for its backward, not what it computes), `pipeline.add_loss`
  (which `add_loss` terms a run accepts, not what a step computes);
- may change, said in one line (`resumed step 20: 2 stages gpipe M=4 -> 2 stages zb1 M=8`) and kept
  in summary.json's `layouts`: the layout (`LAYOUT`: the schedule, microbatches, the split of a cut
  model, copies of a pipeline; the stage count is the checkpoint's layout, `chain.state.by_layer`, and
  the chain's own mlp/conv stages may change `model.depth` with it, regrouping as many layers):
  the same layers and the same data in the same order, each step's sums at most reordered;
- everything else is refused in one line naming the key with its old and new value: the
  model, the loss, the data and its batch, the seed, the mode, gradient accumulation, XLA,
  float16 precision, the mirrored fallback and its replicas, gradient clipping (`optim.clip_*`),
  `pipeline.batch_norm`;
- a checkpoint written before a setting existed resumes when the config leaves it at the value
  that was the behaviour before it (`_ADDED`).
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass, fields, is_dataclass
from typing import Any, Sequence

from chain.config.schema import Settings
from chain.errors import ChainError
from chain.records.summaries import Layout

# Settings fields not recorded: what a resume is asked to do, and the stage template (every
# stage's expanded spec is recorded instead).
_SKIPPED = {"resume", "plan_only", "report", "model", "optim", "stage", "stages", "variants", "notes", "source"}

APPLIED = (
    "optim.lr",
    "optim.beta_1",
    "optim.beta_2",
    "optim.momentum",
    "optim.fused",
    "precision",
    "placement.exchange_dtype",
)
FREE = (
    "trainer.steps",
    "trainer.epochs",
    "trainer.eval_every",
    "trainer.early_stop_patience",
    "trainer.log_every",
    "trainer.progress",
    "trainer.steps_per_call",
    "trainer.on_nan",
    "trainer.profile",
    "trainer.stall_s",
    "trainer.stall_action",  # the watch of a stalled step, not the math
    "trainer.initial_loss_scale",  # float16: the scale itself is restored; this only set its start
    "checkpoint.",
    "cluster.",
    "oom.",
    "placement.devices",
    "placement.visible",
    "placement.memory_limit_mb",
    "placement.reserve_mb",
    "placement.memory_growth",
    "placement.log_device_placement",
    "placement.cpu_memory_mb",
    "placement.plan",
    "placement.plan_budget_s",  # plan=auto's choice is in the others
    "pipeline.recompute",  # what a stage keeps for its backward, not what it computes
    "pipeline.add_loss",
)  # which add_loss terms a run accepts (`exact` refuses what `per_microbatch` computes)
LAYOUT = (
    "pipeline.schedule",
    "pipeline.schedule_file",
    "pipeline.microbatches",
    "pipeline.virtual_stages",
    "placement.split",
    "placement.balance",
)  # where the layers run and in which order the microbatches' sums are taken, not what they are
_STREAM = ("seed", "data.", "trainer.grad_accum", "variants.batch_size")  # what the data stream and random state follow
_E2E_ONLY = ("pipeline.", "loss")  # ignored by the other modes (their notes say so)
# Settings added after checkpoints were first written, with the value that is the behaviour from
# before them: a checkpoint without one resumes under that value.
_ADDED = {
    "optim.clip_norm": None,
    "optim.clip_global_norm": None,
    "pipeline.batch_norm": "microbatch",
    "optim.fused": False,
    "placement.exchange_dtype": "float32",
    "optim.schedule": "constant",
    "optim.warmup_steps": 0,
    "optim.decay_steps": None,
    "optim.floor": 0.0,
    "placement.plan": "manual",
    "placement.plan_budget_s": 0.2,
}
_STAGE = re.compile(r"^(stages|variants)\[(\d+)\]\.(.*)$")
_MISSING = "(unset)"


def _json(value: Any) -> Any:
    return json.loads(json.dumps(asdict(value) if is_dataclass(value) else value, default=repr))


def built_layout(settings: Settings, stages: Sequence, step: int) -> Layout:
    """The layout a built chain of `stages` with `settings` trains on, as from `step`."""
    from chain.state import manifest

    return RunSettings.of(settings).layout(manifest.split(manifest.layout(stages)), step)


@dataclass(frozen=True)
class RunSettings:
    """A run's settings as plain JSON values (`values`: section -> its values; `stages` and
    `variants`: one entry per stage), the form checkpoints store and resumes compare."""

    values: dict[str, Any]

    @classmethod
    def of(cls, settings: Settings) -> RunSettings:
        """What `settings` records: every section but the resume's own switches, each stage expanded."""
        values = {f.name: _json(getattr(settings, f.name)) for f in fields(settings) if f.name not in _SKIPPED}
        values["stages"] = [_json(s) for s in settings.stages]
        values["variants"] = [{"batch_size": v.batch_size, "paused": v.paused} for v in settings.variants]
        return cls(values)

    def layout(self, split: list[int], step: int) -> Layout:
        """The layout these settings train on from `step`, with `split` (layers per stage) as built."""
        flat = self.flat()
        e2e = flat.get("mode") == "e2e"
        replicas = flat.get("placement.replicas")
        return Layout(
            step=step,
            stages=len(split),
            split=list(split),
            schedule=flat.get("pipeline.schedule") if e2e else None,
            microbatches=flat.get("pipeline.microbatches") if e2e else None,
            replicas=replicas if isinstance(replicas, int) else 1,
        )

    def flat(self) -> dict[str, Any]:
        """Every value by its dotted key (`data.batch_size`, `stages[1].optim.lr`), in record order."""
        out: dict[str, Any] = {}

        def walk(prefix: str, value: Any) -> None:
            if isinstance(value, dict) and value:
                for k, v in value.items():
                    walk(f"{prefix}.{k}" if prefix else k, v)
            elif isinstance(value, list) and prefix in ("stages", "variants"):
                for i, v in enumerate(value):
                    walk(f"{prefix}[{i}]", v)
            else:
                out[prefix] = value

        walk("", self.values)
        return out


@dataclass(frozen=True)
class Change:
    """One setting that differs between a checkpoint and the resuming config, named as the user
    writes it (`optim.lr` when every stage changed alike, else `stages[1].optim.lr`)."""

    key: str
    old: Any
    new: Any

    @property
    def general(self) -> str:
        """The key without its stage: what decides whether it may change."""
        m = _STAGE.match(self.key)
        return f"{m.group(1)}.{m.group(3)}" if m and m.group(1) == "variants" else (m.group(3) if m else self.key)


def changes(saved: RunSettings, now: RunSettings) -> list[Change]:
    """The settings that differ, in the record's order; a change made alike in every stage is one `Change`."""
    a, b = saved.flat(), now.flat()
    found = [
        Change(k, a.get(k, _MISSING), b.get(k, _MISSING))
        for k in [*a, *(k for k in b if k not in a)]
        if a.get(k, _MISSING) != b.get(k, _MISSING)
    ]
    n_stages = len(saved.values.get("stages", []))
    out: list[Change] = []
    for c in found:
        m = _STAGE.match(c.key)
        if m and m.group(1) == "stages":
            alike = [
                d
                for d in found
                if (dm := _STAGE.match(d.key))
                and dm.group(1) == "stages"
                and dm.group(3) == m.group(3)
                and (d.old, d.new) == (c.old, c.new)
            ]
            if len(alike) == n_stages:
                if m.group(2) == "0":
                    out.append(Change(m.group(3), c.old, c.new))
                continue
        out.append(c)
    return out


def _matches(key: str, rules: tuple[str, ...]) -> bool:
    return any(key == r or (r.endswith(".") and key.startswith(r)) for r in rules)


def _shown(value: Any) -> str:
    return value if isinstance(value, str) else repr(value)


def _refuse(c: Change, why: str) -> ChainError:
    return ChainError(
        f"the checkpoint was written with {c.key}={c.old!r}, the config has {c.key}={c.new!r}; "
        f"resume needs the same {c.key}: {why}"
    )


_STAGE_KEYS = ("model", "optim", "target")  # a stage's keys, as `changes` names one made alike in every stage
_BODIES = ("mlp", "conv")  # the chain's own stages: their layers regroup over another stage count


def _restaged(saved: RunSettings, now: RunSettings, cut: bool) -> bool:
    """Whether both runs repeat one stage template, the same, over another count of stages (a model cut
    into other stages: whether the layers are the same is the checkpoint's to say), or the chain's own
    mlp/conv stages, the same but for `model.depth`, regroup as many layers (another layout); a
    ChainError when they would regroup another number of layers."""
    a, b = saved.values.get("stages", []), now.values.get("stages", [])
    if len(a) == len(b) or not a or not b:
        return False
    if cut or any(spec["model"].get("name") not in _BODIES for spec in a + b):  # a model given to chain.build
        return all(spec == a[0] for spec in a + b)  # is cut, whatever its stages' `model` section says
    body = [{**spec, "model": {k: v for k, v in spec["model"].items() if k != "depth"}} for spec in a + b]
    for specs, whose in ((body[: len(a)], "the checkpoint's"), (body[len(a) :], "the config's")):
        other = next((spec for spec in specs if spec != specs[0]), None)
        if other is not None:
            raise ChainError(
                f"the checkpoint has {len(a)} stages but the config builds {len(b)}; another stage count regroups "
                f"stages alike but for model.depth, and {whose} differ in {_first_difference(specs[0], other)[0]}"
            )
    if body[0] != body[-1]:
        key, old, new = _first_difference(body[0], body[-1])
        raise ChainError(
            f"the checkpoint's stages have {key}={old!r}, the config's {key}={new!r}: a resume on another "
            f"stage count regroups the same layers; resume needs the same {key}"
        )
    total, built = (sum(spec["model"]["depth"] for spec in specs) for specs in (a, b))
    if total != built:
        even = f"model.depth={total // len(b)}" if total % len(b) == 0 else "+stages=[...] with depths that add up"
        raise ChainError(
            f"the checkpoint's {len(a)} stages hold {total} layers, the config's {len(b)} stages {built}: a resume "
            f"on another stage count regroups the same layers; give {even} (or +stages={len(a)})"
        )
    return True


def _first_difference(a: dict, b: dict) -> tuple[str, Any, Any]:
    """The first dotted key whose value differs between two stage specs, with both values."""
    x, y = RunSettings(a).flat(), RunSettings(b).flat()
    differ = [k for k in [*x, *y] if x.get(k, _MISSING) != y.get(k, _MISSING)]
    key = min(differ, key=lambda k: not k.endswith(".name"))  # another kind of body or optimizer: its name says it
    return key, x.get(key, _MISSING), y.get(key, _MISSING)


def check_resume(saved: RunSettings, settings: Settings, step: int, cut: bool = False) -> list[str]:
    """Compare the settings a checkpoint of `step` was written with against the resuming config:
    returns the `note:` lines of the changes applied from `step` on (`cut`: the resuming chain is one model
    cut into stages, which another stage count re-cuts); raises a one-line
    ChainError naming the first change a resume cannot make."""
    from chain.state.manifest import check_precision

    mode = saved.values.get("mode")
    notes = []
    now = RunSettings.of(settings)
    restaged = _restaged(saved, now, cut)
    for c in changes(saved, now):
        if restaged and (_STAGE.match(c.key) or c.key.partition(".")[0] in _STAGE_KEYS):
            continue  # one stage template over another count of stages: the layout (`chain.state.by_layer`)
        key = c.general
        if c.old == _MISSING and key in _ADDED and c.new == _ADDED[key]:
            continue
        if key == "precision":
            check_precision({"precision": c.old}, settings)  # float16 holds loss scales: refused there
        if _matches(key, FREE + LAYOUT) or (mode != "e2e" and settings.mode != "e2e" and _matches(key, _E2E_ONLY)):
            continue
        if key == "placement.replicas" and "mirrored" not in (
            saved.values.get("placement", {}).get("fallback"),
            settings.placement.fallback,
        ):
            continue  # copies of a pipeline: a checkpoint holds one copy of each stage
        if key == "optim.momentum" and 0.0 in (c.old, c.new):
            raise _refuse(
                c,
                "SGD keeps momentum slots only with a momentum above 0, so there is nothing to "
                "continue from (or to drop); start a new run to change it",
            )
        if _matches(key, APPLIED):
            notes.append(f"note: {c.key} {_shown(c.old)} -> {_shown(c.new)} from step {step}")
            continue
        if _matches(key, _STREAM):
            raise _refuse(c, "the data stream and random state continue only with the same data settings")
        raise _refuse(c, "it changes what every step computes; start a new run (another hydra.run.dir) to change it")
    return notes
