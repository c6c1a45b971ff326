"""Checks across settings: what must hold between keys, known without TensorFlow.

`check_across_keys(settings, info)` raises one `ConfigError` line for the first problem and returns the
`note:` lines for settings the run will ignore; `settle` adds those notes and the number of
steps (`trainer.steps`, or what `trainer.epochs` makes of the training examples). What depends
on the data (`check_data`) is checked here, once, against the description the caller made
(`chain.config.validate_and_describe`), or by the preparation pass (`chain.prepared.with_loaded_data`) once the data is
loaded when only TensorFlow reads it (TFRecord files, the user's function).
Everything here is O(1) in configured numbers (a batch size of 10^12 costs nothing to
refuse). The assignment (the planner's rules, the memory estimate) is checked by `chain.prepared`;
what needs the runtime (devices that exist) by `chain.training.build`.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, replace

from chain.config.schema import CUT_MODELS, MAX_BATCH, BodySettings, Gpt, KerasModel, PlacementSettings, Settings
from chain.config.shapes import stage_shapes
from chain.data import token_ids
from chain.data.paths import keras_model_file
from chain.data.catalog import DataInfo
from chain.data.sources.text.text_examples import PAD
from chain.errors import ConfigError, DeviceError, plural, there_are
from chain.config.device_names import canonical
from chain.schedule.schedules import FILE

DEFAULT_STEPS = 400  # trainer.steps when neither it nor trainer.epochs is set (digits: ~16 epochs)


@dataclass(frozen=True)
class BatchCut:
    """How one step's `data.batch_size` examples are cut, worked out once (`batch_cut`, for the replicas
    the run planned: `RunSpec.batch_cut`): into `replicas` equal shares (mirrored replicas, or copies
    of a pipeline; 1 without either) of `per_replica` examples, each cut into `microbatches` equal
    microbatches (mode=e2e's pipeline; 1 otherwise) of `per_microbatch` examples. With
    `trainer.grad_accum=N` a step takes N such batches, each cut the same way."""

    replicas: int
    microbatches: int
    per_replica: int
    per_microbatch: int


def batch_cut(batch_size: int, replicas: int = 1, microbatches: int = 1, mirrored: bool = False) -> BatchCut:
    """The one rule of a step's batch: `data.batch_size` (the global batch) cuts into `replicas` equal
    shares (mirrored replicas, or copies of a pipeline) of `microbatches` equal microbatches each
    (mode=e2e). Returns the cut; one ConfigError line naming the keys otherwise. The config's checks
    (for the replicas given) and the preparation pass (for the replicas planned) both ask it."""
    per = replicas * microbatches
    if batch_size % per == 0:
        return BatchCut(replicas, microbatches, batch_size // replicas, batch_size // per)
    if replicas == 1:
        fits = math.gcd(microbatches, batch_size)
        bigger = batch_size + microbatches - batch_size % microbatches
        raise ConfigError(
            f"pipeline.microbatches={microbatches} does not divide data.batch_size={batch_size}; microbatches must "
            f"be equal: use pipeline.microbatches={fits} or data.batch_size={bigger} (a multiple of {microbatches})"
        )
    if mirrored:
        raise ConfigError(
            f"data.batch_size={batch_size} does not divide over {replicas} replicas (placement.replicas); with "
            f"placement.fallback=mirrored data.batch_size is the global batch: use a multiple of {replicas}, "
            f"e.g. {max(replicas, batch_size // replicas * replicas)}"
        )
    raise ConfigError(
        f"data.batch_size={batch_size} does not cut into {replicas} replicas' shares (placement.replicas) of "
        f"pipeline.microbatches={microbatches} equal microbatches: use a multiple of {per}, "
        f"e.g. data.batch_size={max(per, batch_size // per * per)}"
    )


def replicated_pipeline(s: Settings) -> None:
    """`placement.replicas` without the mirrored fallback copies the pipeline (mode=e2e): each copy on
    its own devices (so none named per stage) and its equal share of every batch, cut into microbatches."""
    r = s.placement.replicas
    if s.placement.fallback == "mirrored" or r is None or r == 1:
        if s.placement.exchange_dtype != "float32":
            raise ConfigError(
                f"placement.exchange_dtype={s.placement.exchange_dtype} is the dtype copies of a pipeline "
                f"exchange their gradients in, and this run has none (placement.replicas={r}, "
                f"placement.fallback={s.placement.fallback}): set placement.replicas=2 or more with "
                "mode=e2e, or remove placement.exchange_dtype"
            )
        return
    if s.mode != "e2e":
        raise ConfigError(
            f"placement.replicas={r} copies a pipeline, which needs mode=e2e (is {s.mode}); for data "
            "parallel training of other modes use placement.fallback=mirrored, or remove placement.replicas"
        )
    if s.placement.devices:
        raise ConfigError(
            f"placement.devices names one device per stage, but placement.replicas={r} places "
            f"{r} copies of every stage: remove placement.devices (the planner places the grid)"
        )
    if r != "auto":
        batch_cut(s.data.batch_size, r, s.pipeline.microbatches)


def placement_fits(p: PlacementSettings, n_stages: int) -> None:
    """What `placement` must say whatever the machine: one memory limit, or one per stage; stages
    on named devices, or every stage on every replica (placement.fallback=mirrored), not both."""
    given = p.memory_limit_mb
    if isinstance(given, (list, tuple)) and len(given) != n_stages:
        raise ConfigError(
            f"placement.memory_limit_mb has {plural(len(given), 'entry')}, but {there_are(n_stages, 'stage')}; "
            "give one number (MB per logical GPU) or one per stage"
        )
    if p.devices and p.fallback == "mirrored":
        raise ConfigError(
            "placement.devices puts each stage on a device, placement.fallback=mirrored puts "
            "every stage on every replica: set only one of them"
        )


def loss_fits_target(loss: str, target, data: str) -> None:
    """Cross-entropy needs class labels; a real-valued target needs `mse`."""
    if loss == "sparse_categorical_crossentropy" and target.is_regression:
        raise ConfigError(
            f"loss={loss} needs class labels, but target {target.name!r} of data={data} is a real value; "
            "use loss=mse (or a class target: stage.target=label)"
        )


def per_position(s: Settings, info: DataInfo) -> None:
    """A target with a label per position (token data) is learned by one per-token loss: mode=e2e (whose
    last stage must then output logits per position: `chain.stages.assemble.per_position_body`)."""
    for spec in s.stages:
        target = info.target(spec.target)
        if target.shape and s.mode != "e2e":
            raise ConfigError(
                f"target {target.name!r} of data={info.name} has a label per position {target.shape}, "
                f"which only mode=e2e learns (one per-token loss after the last stage); mode={s.mode} "
                "heads learn one label per example"
            )


def ignored_class_fits(ignore_class: int | None, target, data: str) -> None:
    """`ignore_class` is one of the target's class labels (a padding id the data holds) or a negative label
    the data marks positions to leave out with (Hugging Face's -100); one past the classes is a mistake."""
    if ignore_class is not None and (target.is_regression or ignore_class >= target.classes):
        allowed = f"0..{target.classes - 1}" if target.classes else "none: it is a real value"
        raise ConfigError(
            f"ignore_class={ignore_class} is not a class label of target {target.name!r} of "
            f"data={data} (its labels: {allowed}) nor a negative one (as Hugging Face's -100); give the "
            "label the data marks ignored positions with, or ignore_class=null"
        )


def check_cut(s: Settings) -> None:
    """`model=keras` and `model=gpt` cut one model into all the stages; `placement.split`/`balance` say where."""
    cut_models = {spec.model for spec in s.stages if isinstance(spec.model, CUT_MODELS)}
    if cut_models:
        (model, *others) = cut_models
        if others or any(not isinstance(spec.model, CUT_MODELS) for spec in s.stages):
            raise ConfigError(
                f"model={model.name} cuts one model into every stage; per-stage models do not go with it "
                "(drop them from +stages=[...], or use builders: model._target_=...)"
            )
    if isinstance(model := s.stages[0].model, KerasModel):
        if not model.path.endswith(".keras"):
            raise ConfigError(f"model.path={model.path!r} must be a Keras model file (.keras)")
        if not os.path.isfile(model.path):
            raise ConfigError(f"model.path={model.path!r}: no such file")
        keras_model_file(model.path, "model.path")
    p = s.placement
    if p.split is not None and p.balance != "even":
        raise ConfigError(f"placement.split and placement.balance={p.balance} both say where to cut: set one of them")
    if p.split is not None and len(p.split) != len(s.stages):
        raise ConfigError(
            f"placement.split has {plural(len(p.split), 'entry')}, but {there_are(len(s.stages), 'stage')}; "
            "give the layers of each stage"
        )


def gpt(s: Settings) -> Settings:
    """`model=gpt` learns per-token targets of token ids end to end: mode=e2e on data=text, tokens, npz or
    tfrecord (`(N, T)` integer ids: `chain.data.token_ids`), a width its heads divide, and the data's window
    (`model.seq_len` null: `data.seq_len`, or the arrays' T, set here; else equal). Returns `s` with every
    stage's `model.seq_len` settled; `s` itself for any other model."""
    model = s.stages[0].model if s.stages else None
    if not isinstance(model, Gpt):
        return s
    if s.mode != "e2e":
        raise ConfigError(f"model=gpt is one network trained by one per-token loss: it needs mode=e2e (is {s.mode})")
    if model.width % model.heads:
        raise ConfigError(
            f"model.width={model.width} must be a multiple of model.heads={model.heads} (each head "
            "takes width / heads of it)"
        )
    seq_len = token_ids.ids(s.data).seq_len
    if model.seq_len is not None and model.seq_len != seq_len:
        given = (
            f"data.seq_len={seq_len}"
            if s.data.name in token_ids.WINDOWED
            else f"data.x={s.data.x!r}'s {seq_len} ids per example"
        )
        raise ConfigError(
            f"model.seq_len={model.seq_len} differs from {given}, the window the model reads: set "
            "one of them (model.seq_len=null takes the data's)"
        )
    return replace(
        s,
        stages=tuple(
            replace(st, model=replace(st.model, seq_len=seq_len)) if isinstance(st.model, Gpt) else st
            for st in s.stages
        ),
    )


def padding(s: Settings, info: DataInfo | None) -> Settings:
    """Examples of different lengths are padded with id 0 (`chain.data.sources.text.text_examples.PAD`); a
    label per position of them is too, which the loss and the metrics ignore: `ignore_class` null is settled
    to 0; another is refused."""
    if info is None or not info.padded or not info.target(s.stages[-1].target).shape:
        return s
    if s.ignore_class not in (None, PAD):
        raise ConfigError(
            f"ignore_class={s.ignore_class}, but examples of different lengths pad their targets with id {PAD}, "
            f"which the loss must ignore: set ignore_class={PAD} (or null)"
        )
    return replace(s, ignore_class=PAD)


def mirrored_stream(data) -> None:
    """Mirrored replicas each stream files of their own (`chain.data.stream_shares`): of examples of different
    lengths (buckets, or packed windows) one step would join batches of different lengths; one line before
    TensorFlow starts, pointing to copies of the pipeline, which read one stream and cut each batch."""
    if getattr(data, "stream", False) and (data.lengths_vary or data.packed):
        given = "data.pack=true" if data.packed else "data.buckets"
        raise ConfigError(
            f"{given} with placement.fallback=mirrored: each mirrored replica streams its own files, and its "
            "batches of examples of different lengths would not be of one length in a step; train copies of the "
            "pipeline instead (placement.fallback=virtual placement.replicas=N), or one replica"
        )


def gpt_vocab(s: Settings, info: DataInfo) -> None:
    """`model=gpt`'s `vocab` is the data's number of token ids (its output width), and its target a label
    per position of the window it reads."""
    model = s.stages[0].model if s.stages else None
    if not isinstance(model, Gpt):
        return
    target = info.target(s.stages[-1].target)
    if model.vocab != target.classes:
        given = f", or data.classes={{{target.name}: {model.vocab}}}" if info.name in token_ids.ARRAYS else ""
        raise ConfigError(
            f"model.vocab={model.vocab} differs from data={info.name}'s {target.classes} token ids "
            f"(its target's classes): set model.vocab={target.classes}{given}"
        )
    if s.data.lengths_vary:  # examples up to the largest bucket, at most data.seq_len (the positions' rows)
        return
    if target.shape != (model.seq_len,):
        raise ConfigError(
            f"model=gpt learns a label per position of its {model.seq_len} ids, but target "
            f"{target.name!r} of data={info.name} holds {target.shape or 'one label'} per example: "
            f"give an (N, {model.seq_len}) array of integer ids (e.g. the inputs one token on)"
        )


def check_side_by_side(s: Settings) -> None:
    """Independent models share the data stream, not a pipeline: no accumulation, no replicas, no cut."""
    if s.trainer.grad_accum != 1:
        raise ConfigError(
            "trainer.grad_accum applies to a chain; mode=side_by_side gives each model its own "
            "batch size instead (variants[i].data.batch_size)"
        )
    if s.placement.fallback == "mirrored":
        raise ConfigError(
            "placement.fallback=mirrored applies to a chain; side by side, models share devices "
            "(placement.devices) or each has its own"
        )
    if any(isinstance(spec.model, KerasModel) for spec in s.stages):
        raise ConfigError(
            "model=keras cuts one model into a chain; side by side, each variant is a whole model "
            "(mlp, conv, or a builder with _target_)"
        )
    for v in s.variants:  # a slice of the shared batch, so it is the same whatever the neighbours
        if v.batch_size > s.data.batch_size:
            raise ConfigError(
                f"variant {v.name!r}: data.batch_size={v.batch_size} is larger than data.batch_size="
                f"{s.data.batch_size}, the shared batch every variant takes its first examples from; "
                f"set data.batch_size={v.batch_size} (and the others' own data.batch_size)"
            )


def check_data(s: Settings, info: DataInfo) -> None:
    """What must hold between the settings and the data: batch vs data size, targets, stage
    shapes, loss vs target, validation for best checkpoints and early stopping. Run once: by the
    config checks when the data is known without TensorFlow, else by `chain.prepared.with_loaded_data`
    once the data is loaded (before anything is printed or written)."""
    per_step = s.examples_per_step
    if per_step > info.examples:
        have = f"{info.examples} training examples" if info.val_examples else f"{info.examples} examples"
        if s.trainer.grad_accum == 1:
            raise ConfigError(f"data.batch_size={per_step} is larger than data={info.name} ({have})")
        raise ConfigError(
            f"trainer.grad_accum={s.trainer.grad_accum} x data.batch_size={s.data.batch_size} = "
            f"{per_step} examples per step is more than data={info.name} has ({have})"
        )
    for spec in s.stages:
        info.target(spec.target)
    per_position(s, info)
    gpt_vocab(s, info)
    stage_shapes(s.stages, info, s.mode)  # a stage that cannot take its input
    if s.mode == "e2e":
        loss_fits_target(s.loss, info.target(s.stages[-1].target), info.name)
        ignored_class_fits(s.ignore_class, info.target(s.stages[-1].target), info.name)
    if not info.val_examples:
        wants = [
            k
            for k, on in (
                ("checkpoint.best=true", s.checkpoint.best),
                (
                    f"trainer.early_stop_patience={s.trainer.early_stop_patience}",
                    s.trainer.early_stop_patience is not None,
                ),
            )
            if on
        ]
        if wants:
            raise ConfigError(
                f"{wants[0]} needs validation examples, but data={info.name} has none "
                f"(data.val_fraction={s.data.val_fraction}); set data.val_fraction > 0"
            )


def steps(s: Settings, info: DataInfo | None) -> int | None:
    """The run's optimizer steps: `trainer.steps`, or `trainer.epochs` passes over the training
    examples (rounded up to whole steps; None while the data is unknown), or DEFAULT_STEPS."""
    t = s.trainer
    if t.steps is not None:
        return t.steps
    if t.epochs is None:
        return DEFAULT_STEPS
    return None if info is None else math.ceil(t.epochs * info.examples / s.examples_per_step)


def check_profile(s: Settings, n_steps: int | None) -> None:
    """`trainer.profile` traces steps of a pipeline schedule that the run takes (`n_steps`: the run's
    steps, None while the data that `trainer.epochs` counts in is unknown)."""
    if s.trainer.profile is None:
        return
    start, stop = s.trainer.profile
    if n_steps is not None and stop > n_steps:
        given = "trainer.steps" if s.trainer.steps is not None else "the run's steps"
        raise ConfigError(f"trainer.profile=[{start},{stop}] goes past {given}={n_steps}")
    if s.mode != "e2e":
        raise ConfigError("trainer.profile measures a pipeline schedule's actions: it needs mode=e2e")
    profile_ports(s.cluster.workers, s.cluster.profile_ports)


def profile_ports(workers, ports) -> None:
    """`trainer.profile` on cluster workers traces each worker's profiler server: one port per worker."""
    if workers and (ports is None or len(ports) != len(workers)):
        raise ConfigError(
            f"trainer.profile on {len(workers)} cluster workers needs cluster.profile_ports with one "
            "port per worker (each started with python -m chain.worker --profile-port PORT)"
        )


def check_clipping(s: Settings) -> None:
    """One kind of clipping per optimizer (Keras allows one); mode=e2e clips the chain's gradients by
    one global norm, so every stage names the same `clip_global_norm` (or none)."""
    for k, spec in enumerate(s.stages):
        o = spec.optim
        if o.clip_norm is not None and o.clip_global_norm is not None:
            key = "optim" if len(set(s.stages)) == 1 else f"stages[{k}].optim"
            raise ConfigError(
                f"{key}.clip_norm={o.clip_norm} and {key}.clip_global_norm={o.clip_global_norm} are "
                "both set; clip each variable's gradient or all of them by one norm, not both"
            )
    norms = [spec.optim.clip_global_norm for spec in s.stages]
    if s.mode == "e2e" and len(set(norms)) > 1:
        k = next(i for i, n in enumerate(norms) if n != norms[0])
        raise ConfigError(
            f"stages[{k}].optim.clip_global_norm={norms[k]} differs from stages[0]'s {norms[0]}; "
            "mode=e2e clips the whole chain's gradients by one global norm: give every stage the same"
        )


def check_auto_plan(s: Settings, info: DataInfo | None) -> None:
    """`placement.plan=auto` chooses the cut, the copies and the devices itself: one line when the user's
    config gave one of them, or a balance, stages of their own, a schedule file, a model it cannot time (the
    user's builders), the mirrored fallback, or data only TensorFlow reads (`info` None). The user's config
    only: a chosen plan's settings (`chain.autoplan.choice.chosen_settings`) give what it chose."""
    p = s.placement
    if p.plan != "auto":
        return
    given = {"placement.split": p.split, "placement.replicas": p.replicas, "placement.devices": p.devices}
    for key, value in given.items():  # their defaults are null: a given value is told apart reliably
        if value is not None:
            raise ConfigError(f"{key} is what placement.plan=auto chooses: remove it, or set placement.plan=manual")
    if p.balance != "even":
        raise ConfigError(
            f"placement.balance={p.balance}: placement.plan=auto cuts the model by its measured times "
            "itself; remove placement.balance, or set placement.plan=manual"
        )
    if any(st != s.stages[0] for st in s.stages):  # the chosen plan is written +stages=K: K alike stages
        raise ConfigError(
            "placement.plan=auto writes its plan as +stages=K of the stage template, but +stages=[...] "
            "gives the stages settings of their own: give +stages=N, or set placement.plan=manual"
        )
    if s.pipeline.schedule == FILE:
        raise ConfigError(
            "pipeline.schedule=file: placement.plan=auto chooses among the built-in schedules; "
            "set placement.plan=manual to run a schedule file"
        )
    if not isinstance(s.stages[0].model, (BodySettings, *CUT_MODELS)):
        raise ConfigError(
            "placement.plan=auto times the config's own models (model=mlp, conv) or one model cut "
            "into stages (model=keras); the user's stage builders (_target_) are not measured: "
            "set placement.plan=manual"
        )
    if s.cluster.workers is None and p.fallback == "mirrored":
        raise ConfigError(
            "placement.fallback=mirrored runs the chain whole on each replica: placement.plan=auto "
            "plans a pipeline; set placement.fallback=virtual or placement.plan=manual"
        )
    if info is None:
        raise ConfigError(
            f"placement.plan=auto measures the model on examples of the data's shape, which data="
            f"{s.data.name} gives only once TensorFlow reads it: set placement.plan=manual"
        )


def check_across_keys(s: Settings, info: DataInfo | None) -> tuple[str, ...]:
    """Raise a ConfigError for the first inconsistency of `s` (with the data `info` describes,
    when known); return notes on ignored settings."""
    devices = s.placement.devices
    if devices is not None and len(devices) != len(s.stages):
        raise ConfigError(
            f"placement.devices has {plural(len(devices), 'entry')}, but {there_are(len(s.stages), 'stage')}; "
            "give one device per stage"
        )
    for k, d in enumerate(devices or ()):
        try:
            canonical(d)
        except DeviceError as e:
            raise ConfigError(f"placement.devices[{k}]: {e}") from None
    placement_fits(s.placement, len(s.stages))
    if s.placement.plan == "auto" and s.mode != "e2e":
        raise ConfigError(
            f"placement.plan=auto chooses a pipeline's stages, microbatches and schedule, which only "
            f"mode=e2e has (is {s.mode}); set mode=e2e or placement.plan=manual"
        )
    if s.examples_per_step > MAX_BATCH:
        raise ConfigError(
            f"trainer.grad_accum x data.batch_size = {s.examples_per_step} examples per step; at most {MAX_BATCH}"
        )
    t = s.trainer
    if t.steps is not None and t.epochs is not None:
        raise ConfigError(f"trainer.steps={t.steps} and trainer.epochs={t.epochs} are both set; give one")
    if t.early_stop_patience is not None and not t.eval_every:
        raise ConfigError(
            f"trainer.early_stop_patience={t.early_stop_patience} counts evaluations, but "
            "trainer.eval_every=0 evaluates only at the end; set trainer.eval_every=N (steps)"
        )
    if s.mode == "side_by_side":
        check_side_by_side(s)
    if info is not None:
        check_data(s, info)
    check_cut(s)
    check_clipping(s)
    if s.placement.fallback == "mirrored" and s.placement.replicas not in (None, "auto"):
        batch_cut(s.data.batch_size, s.placement.replicas, mirrored=True)
    replicated_pipeline(s)
    notes = []
    if s.mode == "e2e":
        batch_cut(s.data.batch_size, microbatches=s.pipeline.microbatches)
        if s.pipeline.batch_norm == "deferred" and t.jit_compile:
            raise ConfigError(
                "pipeline.batch_norm=deferred records each microbatch's statistics from the stage's "
                "forward as the step traces it, which trainer.jit_compile=true compiles apart: set "
                "one of them"
            )
        if s.pipeline.recompute != "never" and s.pipeline.batch_norm == "deferred":
            raise ConfigError(
                f"pipeline.recompute={s.pipeline.recompute} runs a stage's forward again in its backward, "
                "whose batch statistics pipeline.batch_norm=deferred would count twice: set "
                "pipeline.recompute=never or pipeline.batch_norm=microbatch"
            )
    else:
        defaults = {
            "schedule": "gpipe",
            "microbatches": 1,
            "batch_norm": "microbatch",
            "recompute": "never",
            "virtual_stages": 1,
            "schedule_file": None,
            "schedule_out": None,
            "add_loss": "exact",
        }
        ignored = [f"pipeline.{k}={v}" for k, v in ((k, getattr(s.pipeline, k)) for k in defaults) if v != defaults[k]]
        if s.loss != "sparse_categorical_crossentropy":
            ignored.append(f"loss={s.loss}")
        if s.ignore_class is not None:
            ignored.append(f"ignore_class={s.ignore_class}")
        if ignored:
            notes.append(
                f"{', '.join(ignored)} ignored: mode={s.mode} trains each "
                f"{'stage' if s.mode == 'local' else 'model'}'s head with its own loss "
                "(cross-entropy on classes, squared error on values), without a pipeline"
            )
    return tuple(notes)


def settle_schedules(s: Settings, n_steps: int | None) -> Settings:
    """Each stage's learning-rate schedule with its `optim.decay_steps` settled (null: the run's
    steps, once known), so that checkpoints record the number and a resume that lengthens the run
    keeps its schedule only when it says so; a ConfigError when the decay would end before the warm-up does."""
    specs = []
    alike = all(st.optim == s.stages[0].optim for st in s.stages)
    for k, st in enumerate(s.stages):
        o, key = st.optim, "optim" if alike else f"stages[{k}].optim"
        if o.schedule != "constant":
            end = o.decay_steps if o.decay_steps is not None else n_steps
            if end is not None and end <= o.warmup_steps:
                given = (
                    f"{key}.decay_steps={end}"
                    if o.decay_steps is not None
                    else f"trainer.steps={end} ({key}.decay_steps=null)"
                )
                raise ConfigError(
                    f"{key}.schedule={o.schedule} decays from step {key}.warmup_steps={o.warmup_steps} "
                    f"to {given}: the decay must end after the warm-up; raise {key}.decay_steps or "
                    f"lower {key}.warmup_steps"
                )
            st = replace(st, optim=replace(o, decay_steps=end))
        specs.append(st)
    return replace(s, stages=tuple(specs))


def settle(s: Settings, info: DataInfo | None) -> Settings:
    """`s` checked (`check_across_keys`) against the data `info` describes (None: known once TensorFlow reads
    it), with its notes and, where the data is known, its steps."""
    s = padding(gpt(s), info)
    notes = check_across_keys(s, info)
    if info is not None and info.lengths_vary:
        notes += (
            f"data.buckets: the memory estimate and placement.plan=auto size batches of the largest bucket "
            f"({info.input_shape[0]} ids)",
        )
    n_steps = steps(s, info)
    check_profile(s, n_steps)
    return settle_schedules(replace(s, notes=notes, trainer=replace(s.trainer, steps=n_steps)), n_steps)


def settle_loaded_data(s: Settings, info: DataInfo) -> Settings:
    """`s` checked against the loaded data (`check_data`), with its steps known."""
    check_data(s, info)
    n_steps = steps(s, info)
    check_profile(s, n_steps)
    return settle_schedules(replace(s, trainer=replace(s.trainer, steps=n_steps)), n_steps)
