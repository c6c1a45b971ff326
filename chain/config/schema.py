"""The one config schema: every key, its type and its allowed values, as frozen dataclasses.

Each section is a frozen dataclass whose fields carry their check (`setting(check)`);
`parse(cls, key, raw)` turns a plain mapping into that dataclass, rejecting unknown and
missing keys at any depth (Hydra accepts `+trainer.stepz=5` silently) with one line
that names the key and says what is allowed. Sections with several forms (`model`,
`optim`, `data`) are chosen by their `name` key (`variants`); the `data` section's forms are the
data sources' settings (`chain.data.sources`, one module per source).

`Settings` is the whole validated config; `chain.config.validate` builds it. Nothing
here imports TensorFlow.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields
from typing import Any, Callable, ClassVar, Union

from chain.fields import (
    Check,
    address,
    boolean,
    choice,
    int_or_list,
    int_or_word,
    integer,
    list_of,
    number,
    optional,
    power_of_two,
    required,
    setting,
    step_window,
    string,
)
from chain.data.data_source import MAX_BATCH
from chain.data.sources import settings_classes
from chain.errors import ConfigError, closest, did_you_mean
from chain.schedule import schedules

MODES = ("local", "e2e", "side_by_side")
POLICIES = ("lockstep", "round_robin")
LOSSES = ("sparse_categorical_crossentropy", "mse")
PRECISIONS = ("float32", "mixed_float16", "mixed_bfloat16")
FALLBACKS = ("virtual", "mirrored", "error")
ON_NAN = ("stop", "skip")
STALL_ACTIONS = ("report", "stop")  # trainer.stall_action
ACTIVATIONS = ("relu", "gelu", "tanh", "sigmoid", "linear")
BALANCES = ("even", "params", "time", "memory")
PLANS = ("manual", "auto")  # placement.plan
BATCH_NORMS = ("microbatch", "deferred")
RECOMPUTE = ("never", "except_last", "always")  # torchgpipe's checkpoint=...
ADD_LOSS = ("exact", "per_microbatch")  # pipeline.add_loss

# Bounds that keep every value within what the code (and validation, in O(1)) handles.
MAX_STAGES = 512
MAX_DEPTH = 1024
MAX_WIDTH = 1 << 20
MAX_SEED = 2**32 - 1  # keras.utils.set_random_seed seeds NumPy, which takes 32 bits
MAX_MICROBATCHES = 4096


def parse(cls: type, key: str, raw: Any) -> Any:
    """`raw` (a mapping) as an instance of the section dataclass `cls`, every field checked."""
    if not isinstance(raw, dict):
        raise ConfigError(f"{key} must be a mapping, got {raw!r}")
    join = (lambda k: f"{key}.{k}") if key else (lambda k: k)
    checked = {f.name: f.metadata["check"] for f in fields(cls) if "check" in f.metadata}
    unknown = sorted(set(raw) - set(checked), key=str)
    extra = getattr(cls, "EXTRA", None)  # a section that passes the keys it does not know on
    if unknown and extra is None:
        where = f"of {key}" if key else "at the top level"
        known = [join(k) for k in checked] + (_nested_keys(raw) if not key else [])
        raise ConfigError(
            f"unknown key {join(unknown[0])}; allowed keys {where}: {', '.join(sorted(checked))}"
            f"{did_you_mean(join(unknown[0]), known)}"
        )
    missing = sorted(set(checked) - set(raw))
    if missing:
        raise ConfigError(f"missing key {join(missing[0])}")
    values = {name: check(join(name), raw[name]) for name, check in checked.items()}
    if extra is not None:
        values[extra] = {k: raw[k] for k in unknown}
    return cls(**values)


def _nested_keys(raw: dict) -> list[str]:
    """The dotted keys one level inside the sections of the whole config `raw` (`trainer.steps`)."""
    return [f"{k}.{inner}" for k, v in raw.items() if isinstance(v, dict) for inner in v]


def section(cls: type) -> Check:
    """A check that parses a mapping into `cls`."""
    return lambda key, raw: parse(cls, key, raw)


def variants(*classes: type) -> Check:
    """A check that parses a mapping into the class whose `KIND` (or one of its `KINDS`) is the
    mapping's `name`; a class with `SELECTED_BY` is also chosen by that key alone (`_target_`)."""
    by_kind = {k: c for c in classes for k in getattr(c, "KINDS", None) or (c.KIND,)}
    by_key = {c.SELECTED_BY: c.KIND for c in classes if hasattr(c, "SELECTED_BY")}

    def check(key: str, raw: Any) -> Any:
        if isinstance(raw, dict) and "name" not in raw:
            raw = {"name": next((kind for k, kind in by_key.items() if k in raw), None), **raw}
        name = raw.get("name") if isinstance(raw, dict) else None
        for k, kind in by_key.items():
            if isinstance(raw, dict) and k in raw and name != kind:
                raise ConfigError(f"{key}.{k} is given, so {key}.name must be {kind} (data={kind}), not {name!r}")
        if name not in by_kind:
            raise ConfigError(f"{key}.name={name!r} is not known; allowed: {', '.join(by_kind)}")
        return parse(by_kind[name], key, raw)

    return check


# --- stage bodies ----------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class BodySettings:
    """What every stage body has: `depth` layers, their activation, dropout after each."""

    name: str = setting(
        string, "the body's kind: mlp or conv (a stage's `model: conv` starts from that group's defaults)"
    )
    depth: int = setting(integer(1, MAX_DEPTH), "number of layers")
    activation: str = setting(choice(*ACTIVATIONS), "activation of every layer")
    dropout: float = setting(number(minimum=0.0, below=1.0), "dropout rate after each layer (0: none)")


@dataclass(frozen=True, kw_only=True)
class Mlp(BodySettings):
    """`depth` Dense layers of `width` units (the input flattened first)."""

    KIND: ClassVar[str] = "mlp"
    width: int = setting(integer(1, MAX_WIDTH), "units of every Dense layer")

    def describe(self) -> str:
        return f"mlp(width={self.width}, depth={self.depth})"


@dataclass(frozen=True, kw_only=True)
class Conv(BodySettings):
    """`depth` same-padded Conv2D layers of `filters` filters; needs image input."""

    KIND: ClassVar[str] = "conv"
    filters: int = setting(integer(1, 65536), "filters of every Conv2D layer")
    kernel_size: int = setting(integer(1, 64), "side of every (square) Conv2D kernel")

    def describe(self) -> str:
        return f"conv(filters={self.filters}, depth={self.depth}, kernel_size={self.kernel_size})"


@dataclass(frozen=True, kw_only=True)
class KerasModel:
    """One Keras model from a `.keras` file, cut into the chain's stages (`placement.split`/`balance`)."""

    KIND: ClassVar[str] = "keras"
    name: str = setting(string, "keras: one Keras model cut into the stages")
    path: str = setting(string, "the `.keras` file (required)")
    safe_mode: bool = setting(boolean, "false: load a file's Lambda layers (Python code); only for files you trust")
    imports: tuple[str, ...] = setting(list_of(string), "modules imported first, to register the file's custom classes")

    def describe(self) -> str:
        return f"keras({self.path})"


@dataclass(frozen=True, kw_only=True)
class Builder:
    """A stage body from the user's code: `_target_` names a callable (Hydra's convention), called
    as `target(input_shape=..., **kwargs)`; it returns a keras.Layer, a keras.Model or a list of layers."""

    target: str
    kwargs: dict = field(default_factory=dict)

    def describe(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in self.kwargs.items())
        return f"{self.target}({args})"


def builder(key: str, raw: dict) -> Builder:
    """A `{_target_: path, **kwargs}` mapping as a `Builder`."""
    target = raw["_target_"]
    if not isinstance(target, str) or not all(part.isidentifier() for part in target.split(".")) or "." not in target:
        raise ConfigError(f"{key}._target_={target!r} must name a callable by its import path, e.g. mypkg.nets.encoder")
    return Builder(target=target, kwargs={k: v for k, v in raw.items() if k != "_target_"})


@dataclass(frozen=True, kw_only=True)
class Gpt:
    """The built-in decoder-only transformer (`chain.stages.gpt`): one Keras model cut into the chain's stages
    like `model=keras` (`placement.split`/`balance`); mode=e2e on token ids (data=text, tokens, npz, tfrecord)."""

    KIND: ClassVar[str] = "gpt"
    name: str = setting(string, "gpt: a decoder-only transformer cut into the stages")
    vocab: int = setting(
        integer(2, 1 << 24),
        "token ids 0..vocab-1 and the logits per position (256: bytes, data=text); must equal the data's classes",
    )
    seq_len: int | None = setting(
        optional(integer(1, 1 << 20)),
        "tokens per example (the learned position embedding's length); null: the data's (data.seq_len, or T of "
        "npz/tfrecord (N, T) ids), which it must equal",
    )
    width: int = setting(integer(1, MAX_WIDTH), "the model's width (embedding size); a multiple of model.heads")
    depth: int = setting(integer(1, MAX_DEPTH), "transformer blocks")
    heads: int = setting(integer(1, 4096), "attention heads per block (each of width / heads)")
    tied: bool = setting(
        boolean, "the read-out is the token embedding's transpose (one weight); false: a Dense read-out"
    )
    dropout: float = setting(
        number(minimum=0.0, below=1.0),
        "dropout rate on the embeddings, attention weights and each block's two residual branches (0: none)",
    )

    def describe(self) -> str:
        return f"gpt(width={self.width}, depth={self.depth}, heads={self.heads})"


def model_check(key: str, raw: Any) -> Any:
    """A stage body: the chain's own (`name: mlp|conv`), a cut Keras model (`name: keras`), the built-in
    transformer (`name: gpt`), or a builder (`_target_`)."""
    if isinstance(raw, dict) and "_target_" in raw:
        return builder(key, raw)
    return variants(Mlp, Conv, KerasModel, Gpt)(key, raw)


Model = Union[Mlp, Conv, KerasModel, Gpt, Builder]
CUT_MODELS = (KerasModel, Gpt)  # one model cut into every stage (`placement.split`/`balance`)
MODEL = model_check


# --- optimizers ------------------------------------------------------------------------------


def schedule_check(key: str, v: Any) -> str:
    """`pipeline.schedule`: a schedule of `chain.schedule.schedules.BUILDERS`, read when the config is
    checked (a row added there is a value at once), or `file`."""
    return choice(*schedules.BUILDERS, schedules.FILE)(key, v)


LR_SCHEDULES = ("constant", "warmup_cosine", "warmup_linear")  # optim.schedule (chain.stages.lr_schedules)
NO_DECAY_NORM = "norm"  # optim.no_decay's word for every variable of a normalization layer


@dataclass(frozen=True, kw_only=True)
class Recipe:
    """What every optimizer has: its learning rate and its schedule, gradient clipping (at most one kind).

    The schedule counts the optimizer's own updates (its `iterations`, which checkpoints restore):
    one per step, whatever the microbatches and gradient accumulation, on every stage alike."""

    name: str = setting(string, "the optimizer: adam, adamw or sgd (target: the one optim._target_ names)")
    lr: float = setting(number(positive=True), "learning rate (with a schedule: its peak, after the warm-up)")
    schedule: str = setting(
        choice(*LR_SCHEDULES),
        "the learning rate over the steps: constant, or a linear warm-up from 0 to optim.lr over "
        "optim.warmup_steps, then a cosine (warmup_cosine) or linear (warmup_linear) decay to optim.floor x optim.lr "
        "at step optim.decay_steps",
    )
    warmup_steps: int = setting(
        integer(0, 10**12),
        "steps of the linear warm-up from 0 to optim.lr (0: none; step s < warmup_steps has lr x s / warmup_steps)",
    )
    decay_steps: int | None = setting(
        optional(integer(1, 10**12)),
        "the step at which the decay reaches its floor, counted from the first step (warm-up included); "
        "null: trainer.steps",
    )
    floor: float = setting(
        number(minimum=0.0, maximum=1.0), "the decay's final learning rate as a fraction of optim.lr (0.1: a tenth)"
    )
    clip_norm: float | None = setting(
        optional(number(positive=True)),
        "clip each variable's gradient to this norm (Keras' clipnorm); null: no clipping",
    )
    clip_global_norm: float | None = setting(
        optional(number(positive=True)),
        "clip by the norm over all gradients (Keras' global_clipnorm); mode=e2e: over every stage's; null: none",
    )


@dataclass(frozen=True, kw_only=True)
class Optimizer(Recipe):
    """One of chain's own optimizers, chosen by `name`."""

    fused: bool = setting(
        boolean,
        "update with TensorFlow's fused kernel (one pass over each variable; the default): sgd's results are Keras' "
        "bit for bit, adam's differ from Keras' in the last bits; false: Keras' own update",
    )


@dataclass(frozen=True, kw_only=True)
class Sgd(Optimizer):
    """Stochastic gradient descent (`keras.optimizers.SGD`), with momentum."""

    KIND: ClassVar[str] = "sgd"
    momentum: float = setting(number(minimum=0.0), "momentum (0: plain SGD)")


@dataclass(frozen=True, kw_only=True)
class Adam(Optimizer):
    """Adam (`keras.optimizers.Adam`)."""

    KIND: ClassVar[str] = "adam"
    beta_1: float = setting(number(minimum=0.0, below=1.0), "decay of the first-moment estimate")
    beta_2: float = setting(number(minimum=0.0, below=1.0), "decay of the second-moment estimate")


@dataclass(frozen=True, kw_only=True)
class AdamW(Adam):
    """Adam with decoupled weight decay (`keras.optimizers.AdamW`): before each update every variable
    not excluded by `no_decay` shrinks by lr x weight_decay of itself."""

    KIND: ClassVar[str] = "adamw"
    weight_decay: float = setting(number(minimum=0.0), "decoupled weight decay (Keras' AdamW weight_decay)")
    no_decay: tuple[str, ...] = setting(
        list_of(string),
        f"variables left out of the decay: `{NO_DECAY_NORM}` (every variable of a normalization layer: "
        "LayerNormalization, BatchNormalization, RMS norms, any layer whose class name holds 'Norm') or a part of a "
        "variable's path "
        "(`bias`, `embeddings`, `dense_1/kernel`); []: decay everything",
    )


def optimizer_path(key: str, v: Any) -> str:
    """An optimizer class's dotted import path (what Hydra's `_target_` takes)."""
    parts = v.split(".") if isinstance(v, str) else []
    if len(parts) < 2 or not all(p.isidentifier() for p in parts):
        raise ConfigError(f"{key}={v!r} must be an optimizer's import path, e.g. keras.optimizers.RMSprop")
    return v


@dataclass(frozen=True, kw_only=True)
class KerasOptimizer(Recipe):
    """Any Keras optimizer by its import path (Hydra's `_target_`), one instance per stage; every key
    that is not a `Recipe` key is its keyword argument (`+optim.rho=0.8`); `optim.learning_rate` is `optim.lr`."""

    KIND: ClassVar[str] = "target"
    SELECTED_BY: ClassVar[str] = "_target_"
    EXTRA: ClassVar[str] = "kwargs"
    _target_: str = setting(
        required(optimizer_path, "optim._target_=keras.optimizers.RMSprop"),
        "a Keras optimizer class's import path (keras.optimizers.RMSprop), created through Hydra's instantiate; "
        "anything else is refused before it is called",
    )
    kwargs: dict = field(default_factory=dict)


def optim_check(key: str, raw: Any) -> Any:
    """An optimizer section: chain's own (`name: adam|adamw|sgd`) or any Keras optimizer (`_target_`)."""
    if isinstance(raw, dict) and "learning_rate" in raw and "_target_" in raw:
        raw = {k: v for k, v in raw.items() if k != "learning_rate"} | {"lr": raw["learning_rate"]}
    return variants(Sgd, Adam, AdamW, KerasOptimizer)(key, raw)


Optim = Union[Sgd, Adam, AdamW, KerasOptimizer]
OPTIM = optim_check


# --- data sets ---------------------------------------------------------------------------
# Each source's settings live in its own module of `chain.data.sources`, with its description
# and reader; the `data` section takes its forms from that one registry.

DataSets = settings_classes()
Data = Union[DataSets]
DATA = variants(*DataSets)


# --- the other sections ----------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class StageSpec:
    """One stage: its body, its optimizer and (mode=local) the target its head learns."""

    model: Model = setting(MODEL, "the stage's body: model=mlp|conv|keras|gpt or a builder (_target_)")
    optim: Optim = setting(OPTIM, "the stage's optimizer: optim=adam|adamw|sgd or optim._target_=keras.optimizers.NAME")
    target: str | None = setting(
        optional(string), "mode=local: the data target this stage learns (null: the data's first)"
    )


@dataclass(frozen=True, kw_only=True)
class Trainer:
    """How long and how a run trains. `steps` or `epochs` (passes over the training examples)
    sets the length: `chain.config.checks` turns either into `steps`. `eval_every`: steps between
    evaluations on the validation set (0: only at the end); `early_stop_patience=N` stops after N
    evaluations without a lower validation loss."""

    steps: int | None = setting(
        optional(integer(1, 10**12)),
        "optimizer steps (updates of grad_accum x data.batch_size examples); null: 400, or what "
        "trainer.epochs gives (not both)",
    )
    epochs: int | None = setting(
        optional(integer(1, 10**6)),
        "passes over the training examples, rounded up to whole steps (instead of trainer.steps)",
    )
    eval_every: int = setting(integer(0), "steps between evaluations on the validation set (0: only at the end)")
    early_stop_patience: int | None = setting(
        optional(integer(1)), "stop after N evaluations without a lower validation loss (needs eval_every)"
    )
    log_every: int = setting(integer(1), "steps between log lines and TensorBoard points")
    progress: bool = setting(boolean, "a progress bar on a terminal")
    jit_compile: bool = setting(boolean, "XLA: compile each stage's forward, backward and update on its device")
    grad_accum: int = setting(integer(1, 1 << 16), "batches of data.batch_size summed into each optimizer step")
    steps_per_call: int = setting(
        integer(1, 1 << 20), "optimizer steps per call of the compiled function (same results as 1, bit for bit)"
    )
    initial_loss_scale: float = setting(power_of_two, "precision=mixed_float16: the dynamic loss scale's start")
    on_nan: str = setting(choice(*ON_NAN), "a non-finite loss or gradient: stop (exit 3) or skip that update")
    profile: tuple[int, int] | None = setting(
        optional(step_window), "[START,STOP]: trace those steps (mode=e2e) and measure the schedule's timeline"
    )
    stall_s: float = setting(
        number(minimum=0.0, maximum=10**6),
        "seconds without a completed step before the run says where the step waits (mode=e2e: each "
        "device's last finished action); 0: off",
    )
    stall_action: str = setting(
        choice(*STALL_ACTIONS),
        "after trainer.stall_s without a step: report (say where it waits, once, and keep waiting) or stop "
        "(the same, then exit 7)",
    )


@dataclass(frozen=True, kw_only=True)
class Pipeline:
    schedule: str = setting(
        schedule_check,
        "mode=e2e: the pipeline schedule: sequential, gpipe, 1f1b, eager1f1b (1F1B with each stage's forwards "
        "run earlier), zb1 (zero bubble ZB-H1), interleaved (virtual stages), zbv (V-shaped zero bubble: "
        "stage k and 2D-1-k on device k) or file (read from pipeline.schedule_file)",
    )
    microbatches: int = setting(
        integer(1, MAX_MICROBATCHES), "mode=e2e: microbatches per batch; must divide data.batch_size"
    )
    batch_norm: str = setting(
        choice(*BATCH_NORMS),
        "mode=e2e: BatchNormalization's moving statistics: microbatch (updated per microbatch) or deferred "
        "(once per step, from the whole batch)",
    )
    virtual_stages: int = setting(
        integer(1, MAX_STAGES), "schedule=interleaved: stages per device V; stage k runs on device k mod (stages / V)"
    )
    schedule_file: str | None = setting(
        optional(string),
        "schedule=file: a CSV, one row per device, one action per cell (F3, B3, W3), checked before training",
    )
    schedule_out: str | None = setting(
        optional(string), "plan_only=true: write the schedule to this CSV (the form pipeline.schedule_file reads)"
    )
    recompute: str = setting(
        choice(*RECOMPUTE),
        "mode=e2e: keep each stage's input only and redo its forward in the backward (except_last: "
        "all but each round's last microbatch); less activation memory, one more forward on each stage "
        "but the last",
    )
    add_loss: str = setting(
        choice(*ADD_LOSS),
        "mode=e2e: a model's add_loss terms with microbatches (or trainer.grad_accum): exact (refused unless the "
        "batch is computed whole) or per_microbatch (each microbatch's terms weighed by its share of the batch, as "
        "Megatron and DeepSpeed do: exact only for a term that is a mean over examples)",
    )


@dataclass(frozen=True, kw_only=True)
class PlacementSettings:
    devices: tuple[str, ...] | None = setting(
        optional(list_of(string, 1, MAX_STAGES)), "one device per stage (stages may share one); null: planned"
    )
    fallback: str = setting(choice(*FALLBACKS), "fewer GPUs than stages: split cards, mirror the chain, or refuse")
    memory_limit_mb: int | tuple[int, ...] | None = setting(
        optional(int_or_list(1, 1 << 24)),
        "MB per logical GPU: one number or one per stage; null: share each split card",
    )
    reserve_mb: int = setting(integer(0, 1 << 24), "MB of each split card left out of the even shares (CUDA's own use)")
    memory_growth: bool = setting(boolean, "GPUs without a memory limit allocate memory as needed")
    visible: tuple[int, ...] | None = setting(
        optional(list_of(integer(0, 4096), 1)), "the physical GPUs to use (TensorFlow's numbering); null: all"
    )
    log_device_placement: bool = setting(boolean, "TensorFlow logs the device of every op")
    replicas: int | str | None = setting(
        optional(int_or_word("auto", 1, MAX_STAGES)),
        "fallback=mirrored: replica count (null: every visible GPU, or 2 logical CPUs); a pipeline (mode=e2e): "
        "copies of it, each on its own devices and share of the batch (auto: as many as the GPUs allow; null: 1)",
    )
    exchange_dtype: str = setting(
        choice("float32", "bfloat16"),
        "copies of a pipeline (placement.replicas >= 2): the dtype their gradients travel in to be averaged; bfloat16 "
        "halves the bytes and rounds each copy's gradients to 8 significant bits (not float32's results)",
    )
    cpu_memory_mb: int | None = setting(
        optional(integer(1, 1 << 40)),
        "without GPUs: memory the chain may use (its estimate is checked first); null: the machine's",
    )
    split: tuple[int, ...] | None = setting(
        optional(list_of(integer(1), 1, MAX_STAGES)), "model=keras: layers per stage; null: placement.balance decides"
    )
    balance: str = setting(
        choice(*BALANCES),
        "model=keras without split: near-equal layer counts, parameter counts or measured time, or memory (the "
        "smallest largest estimated peak: weights, gradients, optimizer slots and the activations the schedule holds)",
    )
    plan: str = setting(
        choice(*PLANS),
        "manual: the settings as given; auto (mode=e2e): measure the model's links (the parts between its allowed cuts) on the run's devices and choose "
        "the stages, split, microbatches, schedule, recompute and copies with the smallest predicted step",
    )
    plan_budget_s: float = setting(
        number(positive=True, maximum=86400),
        "placement.plan=auto: seconds its measuring may take beyond the minimum (each link's forward and backward "
        "at the smallest, middle and largest microbatch): F, B, W apart and more sizes while it lasts",
    )


@dataclass(frozen=True, kw_only=True)
class SideBySideSettings:
    """mode=side_by_side: `lockstep` (every model a step per batch, one compiled step: models on
    different devices run at once) or `round_robin` (one model at a time: lower peak memory)."""

    policy: str = setting(
        choice(*POLICIES), "lockstep: every model in one compiled step; round_robin: one model at a time (less memory)"
    )


@dataclass(frozen=True, kw_only=True)
class OomSettings:
    """Out of memory in a step (mode=side_by_side): shrink the batch of the models on that device."""

    shrink: float = setting(
        number(positive=True, below=1.0), "out of memory in a step: the batch of the models on that device times this"
    )
    min_batch_size: int = setting(
        integer(1, MAX_BATCH), "below it the run stops (exit 6, the last complete checkpoint intact)"
    )


@dataclass(frozen=True, kw_only=True)
class ClusterSettings:
    """Stages on TensorFlow cluster workers (`python -m chain.worker`), by their addresses in task order."""

    workers: tuple[str, ...] | None = setting(
        optional(list_of(address, 1, MAX_STAGES)),
        "host:port of each python -m chain.worker, in task order (null: TF_CONFIG, or none)",
    )
    lost_after_s: float = setting(
        number(positive=True, maximum=3600), "a worker (or TF_CONFIG peer) silent this long stops the run (exit 5)"
    )
    profile_ports: tuple[int, ...] | None = setting(
        optional(list_of(integer(1, 65535), 1, MAX_STAGES)),
        "trainer.profile on workers: each one's --profile-port, in task order",
    )
    launcher: str = setting(
        choice("none", "slurm"),
        "slurm: every task of `srun python -m chain ...` runs the same command; task 0 is the client, the others "
        "its workers (addresses from the step's node list and cluster.port_base)",
    )
    port_base: int = setting(
        integer(1, 65535 - MAX_STAGES), "cluster.launcher=slurm: a task's port is this plus its rank on its node"
    )
    wait_s: float = setting(
        number(positive=True, maximum=86400),
        "under a scheduler (TF_CONFIG with a chief, cluster.launcher=slurm): how long the client waits for its "
        "workers to start, and a worker for its client to come (back)",
    )
    on_lost: str = setting(
        choice("stop", "replan", "wait"),
        "a worker lost during a run: stop (exit 5), replan (continue from the last complete checkpoint on the "
        "workers that still answer, or on local devices), wait (for it to answer again, then continue as before)",
    )
    on_lost_wait_s: float = setting(
        number(positive=True, maximum=86400), "cluster.on_lost=wait: how long a lost worker is waited for"
    )


@dataclass(frozen=True, kw_only=True)
class CheckpointSettings:
    every: int = setting(integer(0), "steps between checkpoints (0: only at the end)")
    keep: int = setting(integer(1, 10000), "complete checkpoints kept")
    export: bool = setting(boolean, "write stage_NN.keras, head_NN.keras and chain.keras at the end")
    fallback: bool = setting(
        boolean, "resume=true with a damaged newest checkpoint: resume from the newest older one that verifies"
    )
    best: bool = setting(boolean, "keep the checkpoint of the lowest validation loss in RUN_DIR/best/")
    accept_changed_files: bool = setting(
        boolean,
        "resume=true over a stream's files that changed (data.stream=true): train on them as they are now, the "
        "stream restarted, instead of refusing",
    )


@dataclass(frozen=True, kw_only=True)
class Settings:
    """The validated config of one run: typed, frozen, produced once by `chain.config.validate`.

    `stages` is the expanded list of stage specs (`+stages=N` or per-stage overrides of
    the `stage` template; mode=side_by_side: one per variant, `variants` says which);
    `notes` are `note:` lines about settings the run ignores.
    `source` is the composed Hydra config it came from (None when built from a dict).
    """

    seed: int = setting(integer(0, MAX_SEED), "seeds weights, data order, the validation split and dropout")
    mode: str = setting(
        choice(*MODES),
        "local: each stage learns its own target through a small head; e2e: one network, one loss; "
        "side_by_side: independent models",
    )
    loss: str = setting(choice(*LOSSES), "mode=e2e: cross-entropy on class labels (from logits), or squared error")
    ignore_class: int | None = setting(
        optional(integer(-(2**31), 2**31 - 1)),
        "mode=e2e: a label the loss ignores (a padding id among the classes, or a negative one such as Hugging "
        "Face's -100): the loss is the mean over the other labels, as Keras' ignore_class",
    )
    precision: str = setting(choice(*PRECISIONS), "what stage bodies compute in; weights stay float32")
    resume: bool = setting(boolean, "continue the run in hydra.run.dir from its newest complete checkpoint")
    plan_only: bool = setting(boolean, "print the placement (and, mode=e2e, the schedule) and exit without training")
    report: bool = setting(boolean, "write report.html in the run directory at the end")
    model: Model = setting(MODEL, "the stage template's body (model=mlp|conv|keras|gpt, or model._target_=...)")
    optim: Optim = setting(
        OPTIM, "the stage template's optimizer (optim=adam|adamw|sgd, or optim._target_=keras.optimizers.NAME)"
    )
    data: Data = setting(DATA, "the data source (data=digits|synthetic|npz|csv|tfrecord|keras|callable|tokens|text)")
    stage: StageSpec = setting(section(StageSpec), "the template every stage starts from")
    trainer: Trainer = setting(section(Trainer), "how long and how a run trains")
    pipeline: Pipeline = setting(section(Pipeline), "mode=e2e: the pipeline schedule")
    placement: PlacementSettings = setting(section(PlacementSettings), "where stages run")
    checkpoint: CheckpointSettings = setting(section(CheckpointSettings), "checkpoints and exports")
    cluster: ClusterSettings = setting(section(ClusterSettings), "stages on cluster workers")
    side_by_side: SideBySideSettings = setting(
        section(SideBySideSettings), "mode=side_by_side: how the models take turns"
    )
    oom: OomSettings = setting(section(OomSettings), "mode=side_by_side: out-of-memory backoff")
    stages: tuple[StageSpec, ...] = ()
    variants: tuple = ()  # mode=side_by_side: one `chain.config.variants.Variant` per stage
    notes: tuple[str, ...] = ()
    source: Any = field(default=None, compare=False, repr=False)

    @property
    def examples_per_step(self) -> int:
        """Examples behind one optimizer step: `trainer.grad_accum` x `data.batch_size` (side by
        side, where grad_accum is 1: the shared batch, of which every variant takes its first
        examples, so each sees the same batches whatever its neighbours)."""
        return self.trainer.grad_accum * self.data.batch_size

    @property
    def ignored_label(self) -> int | None:
        """The label the loss leaves out, which the data may hold besides its classes: `ignore_class`
        in mode=e2e (the other modes' heads ignore the setting)."""
        return self.ignore_class if self.mode == "e2e" else None


def plain(section_value: Any) -> dict:
    """A section as a plain dict of JSON values (for files such as the checkpoint manifest, and
    to compare with what such a file holds): tuples become lists."""
    return json.loads(json.dumps(asdict(section_value)))


# --- stage expansion -------------------------------------------------------------------------


def _merge(base: dict, override: dict) -> dict:
    out = dict(base)
    for k, v in override.items():
        out[k] = _merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def expand_stages(
    stages: Any, template: StageSpec, group_defaults: Callable[[str, str], dict], key_name: str = "stages"
) -> tuple[StageSpec, ...]:
    """Expand `stages` (None, N, or a list of per-stage overrides) into N stage specs.

    A per-stage `model: conv` (a bare name) starts that stage from the packaged
    `model/conv.yaml` instead of the template's model; likewise for `optim`.
    """
    if stages is None:
        stages = 2
    if isinstance(stages, int) and not isinstance(stages, bool):
        if not 1 <= stages <= MAX_STAGES:
            raise ConfigError(
                f"stages={stages} must be a positive integer (at most {MAX_STAGES}) or a list of per-stage overrides"
            )
        return (template,) * stages
    if not isinstance(stages, (list, tuple)) or not stages:
        raise ConfigError(
            f"stages={stages!r} must be a positive integer or a non-empty list of per-stage overrides, e.g. +stages=3"
        )
    if len(stages) > MAX_STAGES:
        raise ConfigError(f"stages has {len(stages)} entries; at most {MAX_STAGES} stages are allowed")
    base = plain(template)
    if isinstance(template.model, Builder):  # as the config wrote it, so a stage can override its arguments
        base["model"] = {"_target_": template.model.target, **template.model.kwargs}
    if isinstance(template.optim, KerasOptimizer):  # its keyword arguments as the config wrote them
        base["optim"] = {**{k: v for k, v in base["optim"].items() if k != "kwargs"}, **template.optim.kwargs}
    specs = []
    for i, over in enumerate(stages):
        key = f"{key_name}[{i}]"
        over = {} if over is None else over
        if not isinstance(over, dict):
            raise ConfigError(f"{key}={over!r} must be a mapping of overrides, e.g. {{model: {{width: 32}}}}")
        unknown = sorted(set(over) - set(base), key=str)
        if unknown:
            near = closest(unknown[0], base)
            hint = f"; did you mean {key}.{near}?" if near else ""
            raise ConfigError(
                f"unknown key {key}.{unknown[0]}; allowed keys of a stage: {', '.join(sorted(base))}{hint}"
            )
        spec = _merge(base, {k: v for k, v in over.items() if k not in ("model", "optim")})
        for group in ("model", "optim"):
            value = over.get(group, {})
            if isinstance(value, dict) and "_target_" in value:  # a builder (a Keras optimizer) replaces the template
                start = {} if group == "model" else group_defaults(group, "target")
            elif isinstance(value, str):  # `model: conv`: that group's packaged defaults
                start, value = group_defaults(group, value), {}
            elif isinstance(value, dict) and value.get("name", base[group].get("name")) != base[group].get("name"):
                start = group_defaults(group, value["name"])
            else:
                start = base[group]
            spec[group] = _merge(start, value) if isinstance(value, dict) else value
        specs.append(parse(StageSpec, key, spec))
    return tuple(specs)
