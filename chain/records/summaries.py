"""summary.json: a run in figures, and each stage's entry in it.

Every field says what it means (`help`): the field list of docs/run-directory.md is generated
from these definitions (`scripts/summary_reference.py`, checked by tests/test_records.py).
Optional groups of fields (`section=True`) exist only for the runs they apply to; in the file
they sit beside the run's own fields, as they always have.
"""

from __future__ import annotations

from dataclasses import dataclass

from chain.records.serial import item


@dataclass(frozen=True)
class StageLosses:
    """mode=local (and side by side): what the stage learns on its own head."""

    target: str | None = item("the target the stage's head learns")
    loss_first: float | None = item("the stage's own loss at step 1")
    loss_last: float | None = item("the stage's own loss at the last step")


@dataclass(frozen=True)
class VariantFields:
    """mode=side_by_side: which variant the stage is."""

    variant: str | None = item("the variant's name")
    overrides: dict | None = item("the variant's overrides of the stage template")
    batch_size: int | None = item("the variant's batch size at the end (after any out-of-memory backoff)")
    paused: bool | None = item("whether the variant was paused (kept and checkpointed, not trained)")


@dataclass
class StageTimes:
    """trainer.profile: the stage's measured times, means per profiled step (see measuring.md)."""

    busy_fraction: float | None = item("the share of the step's span in which any of its actions ran")
    busy_ms: float | None = item("the time any of its actions ran (ms)")
    forward_ms: float | None = item("its forwards (ms)")
    backward_ms: float | None = item("its backwards (ms)")
    copy_ms: float | None = item("the transfer ops inside its actions (ms)")
    copy_wait_ms: float | None = item("idle time after its next input was ready on another device (ms)")
    update_ms: float | None = item("its optimizer update (ms)")


@dataclass(frozen=True)
class StageSummary:
    """One stage's entry in summary.json (`stages`)."""

    index: int | None = item("the stage's position in the chain, from 0")
    device: str | None = item("the device it ran on (null: mirrored, every replica holds it)")
    variable_devices: list[str] | None = item("the devices its variables live on")
    params: int | None = item("its parameter count")
    peak_memory_bytes: int | None = item("the peak memory of its device (null: mirrored)")
    skipped_steps: int | None = item("steps whose update of this stage the numerics guard dropped")
    loss_scale: float | None = item("precision=mixed_float16: the stage's loss scale at the end (else null)")
    overflow_steps: int | None = item("precision=mixed_float16: steps skipped for a loss-scale overflow")
    own: StageLosses | None = item(
        "mode=local and side by side: the stage's own target and losses", default=None, section=True
    )
    variant: VariantFields | None = item("mode=side_by_side: the variant", default=None, section=True)
    model: str | None = item("what the stage is (the placement table's description)", default=None)
    physical: str | None = item("the physical device behind its logical one", default=None)
    val: dict[str, float] | None = item(
        "mode=local: the stage's last validation metrics (only with a validation set)", default=None, omit_none=True
    )
    measured: StageTimes | None = item("trainer.profile: the stage's measured times", default=None, section=True)
    estimated_peak_bytes: int | None = item(
        "the stage's estimated peak memory before training (weights, gradients, optimizer slots, activations "
        "its schedule holds, inputs), beside `peak_memory_bytes` (null: not known before it was built)",
        default=None,
        omit_none=True,
    )


@dataclass(frozen=True)
class ChainFields:
    """mode=e2e: the chain's one loss."""

    loss_fn: str | None = item("the chain's loss function (`loss`)")
    target: str | None = item("the target the chain learns")


@dataclass(frozen=True)
class ClippingFields:
    """optim.clip_global_norm (mode=e2e): the global gradient norm, before clipping (every step's is
    TensorBoard's `grad_norm`)."""

    grad_norm_first: float | None = item("the global gradient norm of step 1")
    grad_norm_last: float | None = item("the global gradient norm of the last step")


@dataclass(frozen=True)
class PipelineFields:
    """mode=e2e, pipelined: the schedule."""

    schedule: str | None = item("the pipeline schedule's name")
    microbatches: int | None = item("microbatches per step")
    bubble_fraction: float | None = item("the planned bubble fraction (unit-time actions)")
    recompute: str | None = item("pipeline.recompute: never, except_last or always", default=None, omit_none=True)
    schedule_file: str | None = item(
        "pipeline.schedule=file: the schedule file's absolute path", default=None, omit_none=True
    )
    schedule_devices: int | None = item(
        "stages sharing devices (interleaved: stage k on device k mod this; zbv: stage k and 2D-1-k on device k): the devices they share",
        default=None,
        omit_none=True,
    )


@dataclass(frozen=True)
class ReplicasFields:
    """placement.replicas (mode=e2e): copies of the pipeline, trained data parallel."""

    replicas: int | None = item("the copies of the pipeline")
    grid: list[list[str]] | None = item("each copy's devices, stage by stage (grid[r][k]: copy r's stage k)")


@dataclass(frozen=True)
class MirroredFields:
    """placement.fallback=mirrored: the replicas."""

    replica_devices: list[str] | None = item("every replica's device")
    per_replica_batch_size: int | None = item("examples per replica per chunk")
    replica_peak_memory_bytes: list[int | None] | None = item("each replica's peak memory (null: another host's)")


@dataclass(frozen=True)
class OomEvent:
    """mode=side_by_side: one out-of-memory backoff."""

    step: int | None = item("the step that ran out of memory")
    device: str | None = item("the device that ran out (null: not named by TensorFlow)")
    batch_sizes: dict[str, list[int]] | None = item("each shrunk variant's batch size, [before, after]")


@dataclass(frozen=True)
class Ranked:
    """mode=side_by_side: one variant's place in the ranking."""

    rank: int | None = item("its place, from 1")
    variant: str | None = item("the variant's name")
    overrides: dict | None = item("its overrides")
    metric: str | None = item("what ranks it: val_loss, or loss_last without a validation set")
    value: float | None = item("that metric's value (null: paused, or not finite)")
    steps_per_second: float | None = item("the run's steps per second")
    peak_memory_bytes: int | None = item("its device's peak memory")
    paused: bool | None = item("whether it was paused")


@dataclass(frozen=True)
class SideBySideFields:
    """mode=side_by_side: the policy, the backoffs and the ranking."""

    policy: str | None = item("side_by_side.policy")
    oom_events: list[OomEvent] | None = item("every out-of-memory backoff")
    ranking: list[Ranked] | None = item("the variants ranked, best first")


@dataclass(frozen=True)
class ProfileFields:
    """trainer.profile: what the trace measured (timeline.json holds the rest)."""

    measured_bubble_fraction: float | None = item("idle device time over devices x span, over the profiled steps")
    profiled_steps: list[int] | None = item("the steps traced")
    slowest_stage: int | None = item("the busiest stage")
    balance_advice: str | None = item("the balance advice in one line (null: balanced)")


@dataclass(frozen=True)
class DataWait:
    """`data_wait_ms`: how long a step waited for its batch (the time in the iterator's get-next
    before the step could start), over the steps of every call but the process's first (as the
    speed: the first call starts the stream and traces)."""

    mean: float | None = item("the mean wait of a step (ms)")
    p95: float | None = item("the 95th percentile of a step's wait (ms)")
    steps: int | None = item("the steps measured")


@dataclass(frozen=True)
class PlannedCandidate:
    """placement.plan=auto: one of the best candidates the search ranked (`plan.ranked`)."""

    rank: int | None = item("its place, from 1: the chosen plan first, then the others by predicted step")
    overrides: list[str] | None = item("the overrides that run it by hand")
    predicted_step_ms: float | None = item("its predicted step (ms): its schedule played on the measured times")
    examples_per_second: float | None = item("the global batch over the predicted step")
    bubble_fraction: float | None = item("the idle share of its devices in that play")
    devices: list[str] | None = item("the devices it uses (null: left to the planner)")
    peak_bytes: list[int] | None = item("each used device's estimated peak memory")
    memory_bytes: list[int | None] | None = item("each used device's memory (null: not known, as logical CPUs)")


@dataclass(frozen=True)
class PlanFields:
    """placement.plan=auto: the plan the search chose, its predicted step next to the run's measured one."""

    overrides: list[str] | None = item(
        "the chosen plan's overrides: after the run's own (without placement.plan), they run it by hand"
    )
    predicted_step_ms: float | None = item("the chosen plan's predicted step (ms)")
    measured_step_ms: float | None = item(
        "the run's measured step (ms): the median over its timed steps (every call but the first, which traces; a "
        "call of trainer.steps_per_call steps counts as that many steps of its mean time); null: the run made one call"
    )
    ratio: float | None = item("measured_step_ms / predicted_step_ms (null: not measured)")
    measuring_s: float | None = item("seconds spent measuring the links (0: read from the run directory's cache)")
    searching_s: float | None = item("seconds spent predicting and ranking the candidates")
    cached: bool | None = item(
        "whether the measurements were read from the run directory (a resume measures "
        "nothing; a run of another model, batch, devices, settings or versions measures again)"
    )
    measured_by: str | None = item(
        "cached: the run that measured them (its time, process and model), and the key "
        "both runs share; absent when this run measured",
        omit_none=True,
    )
    candidates: int | None = item("the candidates predicted")
    dropped_for_memory: int | None = item("the candidates dropped: over a device's memory by the estimate")
    ranked: list[PlannedCandidate] | None = item("the best candidates, the chosen first (each: the fields below)")


@dataclass(frozen=True)
class Layout:
    """One layout a run trained on, from the step it began (summary.json's `layouts`, oldest first)."""

    step: int = item("the step it began from (0: the run's start; else the step a resume restored)")
    stages: int = item("the chain's stages")
    split: list[int] = item("layers per stage")
    schedule: str | None = item("mode=e2e: `pipeline.schedule`")
    microbatches: int | None = item("mode=e2e: `pipeline.microbatches`")
    replicas: int = item("copies of the chain (`placement.replicas`; 1: one)")

    def describe(self, split: bool = False) -> str:
        """`2 stages gpipe M=4` (with `split`: `2 stages (layers 9+10) gpipe M=4`; copies: `x2 copies`)."""
        words = [f"{self.stages} stage" + ("s" if self.stages != 1 else "")]
        if split:
            words.append(f"(layers {'+'.join(map(str, self.split))})")
        if self.schedule is not None:
            words += [self.schedule, f"M={self.microbatches}"]
        if self.replicas > 1:
            words.append(f"x{self.replicas} copies")
        return " ".join(words)

    def same(self, other: Layout) -> bool:
        """Whether `other` is this layout (whatever step each began)."""
        return self.describe(split=True) == other.describe(split=True)


@dataclass(frozen=True)
class Layouts:
    """The layouts a run trained on, oldest first, as each checkpoint's record keeps them."""

    layouts: list[Layout] | None = item("each layout with the step it began (null: recorded before layouts were)")


@dataclass(frozen=True)
class LostWorker:
    """A cluster worker lost during a run that went on (`cluster.on_lost=replan` or `wait`)."""

    worker: int = item("the lost worker's index in the workers before")
    address: str = item("its host:port")
    step: int = item("the step training had reached when it was lost")
    resumed_from: int = item("the last complete checkpoint's step, which the run went on from")
    recomputed: int = item("steps trained again (step - resumed_from)")
    action: str = item("replanned (on the workers that answered) or waited (for it to answer again)")
    workers_before: list[str] = item("the workers before")
    workers_after: list[str] = item("the workers after ([]: local devices)")
    seconds_lost: float = item(
        "seconds from the loss being noticed to the fresh process's start (probing the workers, waiting); "
        "the steps recomputed come on top"
    )
    layout_before: str | None = item(
        "what the run trained on until then: stages, schedule, microbatches, copies (null: not known)", default=None
    )
    layout_after: str | None = item(
        "what it went on with (placement.plan=auto plans again; null: not known)", default=None
    )

    def line(self) -> str:
        """The log's line: `worker 1 (host:port) lost at step 15: re-planned on 1 worker, ...`."""
        n = len(self.workers_after)
        how = (
            f"waited for it to answer again, continued on the same {n} worker" + ("s" if n != 1 else "")
            if self.action == "waited"
            else "re-planned on " + (f"{n} worker" + ("s" if n != 1 else "") if n else "local devices")
        )
        if self.layout_before and self.layout_after:
            moved = self.layout_before != self.layout_after
            how += f" ({self.layout_before} -> {self.layout_after})" if moved else f" ({self.layout_after}, as before)"
        return (
            f"worker {self.worker} ({self.address}) lost at step {self.step}: {how}, resumed from step "
            f"{self.resumed_from} ({self.recomputed} step{'s' if self.recomputed != 1 else ''} recomputed), "
            f"{self.seconds_lost:.1f} s lost"
        )


@dataclass(frozen=True)
class LostWorkers:
    """The workers lost during a run that went on, oldest first (what a supervised process is told)."""

    events: list[LostWorker] = item("each loss, oldest first")


@dataclass(frozen=True)
class Summary:
    """summary.json: what every run writes, then what the way of training adds."""

    mode: str | None = item("`mode`: local, e2e or side_by_side")
    strategy: str | None = item("the way of training (pipeline, mirrored, side_by_side)")
    steps: int | None = item("optimizer steps taken (the global step at the end)")
    early_stopped: bool | None = item("whether early stopping ended the run before trainer.steps")
    resumed_from: int | None = item("the step this process resumed from (null: a fresh run)")
    batch_size: int | None = item("`data.batch_size`: examples per chunk")
    grad_accum: int | None = item("`trainer.grad_accum`: chunks per optimizer step")
    examples_per_step: int | None = item("examples behind one optimizer step")
    train_examples: int | None = item("training examples in the data set")
    val_examples: int | None = item("validation examples (0: none)")
    precision: str | None = item("the config's `precision`")
    jit_compile: bool | None = item("the config's `trainer.jit_compile`")
    seed: int | None = item("the config's `seed`")
    examples_per_second: float | None = item(
        "examples trained per second, the first call (which compiles) left out (null: the run made one call)"
    )
    steps_per_second: float | None = item("optimizer steps per second, measured as examples_per_second")
    data_wait_ms: DataWait | None = item(
        "the time each optimizer step waited for its batch, per step (not per "
        "call of trainer.steps_per_call steps): mean and 95th percentile in ms "
        "(null: the run made one call)"
    )
    loss_first: float | None = item("the loss of step 1")
    loss_last: float | None = item("the loss of the last step")
    val: dict[str, float] | None = item("mode=e2e: the chain's last validation metrics (null: none, or mode=local)")
    best_step: int | None = item("the step of the lowest validation loss (null: no validation)")
    skipped_steps: int | None = item("stage updates the numerics guard dropped, over all stages")
    peak_memory_scope: str | None = item("what a peak memory figure covers: device, or process (logical CPUs)")
    stages: list[StageSummary] | None = item("one entry per stage (the fields below)")
    chain: ChainFields | None = item("mode=e2e", default=None, section=True)
    pipeline: PipelineFields | None = item("mode=e2e, pipelined", default=None, section=True)
    replicas: ReplicasFields | None = item("placement.replicas: copies of the pipeline", default=None, section=True)
    clipping: ClippingFields | None = item("optim.clip_global_norm (mode=e2e)", default=None, section=True)
    mirrored: MirroredFields | None = item("a mirrored run (placement.fallback=mirrored)", default=None, section=True)
    side_by_side: SideBySideFields | None = item("mode=side_by_side", default=None, section=True)
    profile: ProfileFields | None = item("trainer.profile", default=None, section=True)
    exports: list[str] | None = item("checkpoint.export: the .keras files written", default=None, omit_none=True)
    export_error: str | None = item(
        "why the exports were skipped (only when Keras could not save the chain)", default=None, omit_none=True
    )
    estimated_peak_bytes: int | None = item(
        "the sum of the stages' estimated peaks: on logical CPUs (`peak_memory_scope` process) what the one "
        "process-wide peak is compared with (null: a stage's estimate unknown)",
        default=None,
        omit_none=True,
    )
    skipped_records: int | None = item(
        "data.stream with data.on_bad_record=skip: the bad records skipped (by this process: a resume counts from 0)",
        default=None,
        omit_none=True,
    )
    traces: dict[str, int] | None = item(
        "the compiled training step's traces per input shape of a batch, its batch axis left out (e.g. "
        '{"16": 1, "32": 1}: data.buckets, one per bucket; by this process)',
        default=None,
        omit_none=True,
    )
    layouts: list[Layout] | None = item(
        "the layouts the run trained on, oldest first, each with the step it began (a resume may change the "
        "stages, split, schedule, microbatches and copies: see checkpoints.md; each: the fields below)",
        default=None,
        omit_none=True,
    )
    plan: PlanFields | None = item(
        "placement.plan=auto: the chosen plan, predicted against measured (absent with placement.plan=manual)",
        default=None,
        omit_none=True,
    )
    lost_workers: list[LostWorker] | None = item(
        "cluster.on_lost=replan or wait: each worker lost while the run went on, oldest first (each: the fields "
        "below; absent: none lost)",
        default=None,
        omit_none=True,
    )
