"""Peak memory of GPipe against 1F1B on the same chain, M = 2K microbatches, each with
pipeline.recompute=never|except_last|always, and their step times; zb1, interleaved
(K stages on K/2 devices, pipeline.virtual_stages=2) and zbv (K stages on K/2 devices in a V, stages
k and K-1-k on device k) beside them, without recomputation.

    python scripts/bench_pipeline_memory.py                 # defaults below, 5 repeats
    python scripts/bench_pipeline_memory.py --repeats 3 --width 256
    python scripts/bench_pipeline_memory.py --extra='placement.devices=[/GPU:0,/GPU:1,/GPU:2,/GPU:3]'
    python scripts/bench_pipeline_memory.py --trace --schedule gpipe --recompute always --width 256 --depth 8

`--trace` measures nothing into the docs: it profiles one step after warm-up and prints what is live
at that step's memory peak, by category, in requested and allocated bytes
(`chain.pipeline.memory_trace`); `--weights-late` traces the step as it was before
`chain.pipeline.play.weights_first` and `summed_in_turn`.

Not a test: it prints medians and writes them to docs/benchmarks.md (its own section;
other sections of that file are kept).

Every measurement runs in a fresh process, because on CPU all logical devices share one
allocator and `tf.config.experimental.get_memory_info` reports the process-wide peak. A
worker builds the chain, runs warm-up steps (tracing and first-run allocations), resets
the peak, runs the measured steps and reports the peak. The schedules alternate
between repeats so that drift on a shared machine hits both alike.

On GPUs each stage's device has its own allocator, and the table shows each stage's peak.

Sizes are chosen so that activations dominate: wide layers, a large batch, SGD (no
optimizer slots). GPipe holds all M microbatches' activations on every stage; 1F1B holds
at most K-k on stage k, so it should need markedly less.

`--ablation` also measures both schedules with the engine's per-stage control
dependencies removed (the step built under `ablations.UNORDERED`, scripts/ablations.py):
the dataflow executor then runs every op as soon as its inputs are ready, and the
schedule's order, with 1F1B's memory bound, is lost.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SECTION = "bench_pipeline_memory"
SCHEDULES = ("gpipe", "1f1b")  # each with every recompute policy
SPLIT_AND_LOOPED = ("zb1", "interleaved", "zbv")  # recompute=never only (a split backward does not recompute)
VIRTUAL = 2  # interleaved: stages per device (pipeline.virtual_stages)
RECOMPUTE = ("never", "except_last", "always")


def overrides(a: argparse.Namespace, schedule: str, recompute: str = "never") -> list[str]:
    """The chain under test, as command-line overrides."""
    looped = [f"pipeline.virtual_stages={VIRTUAL}"] if schedule == "interleaved" else []
    return (
        [
            f"+stages={a.stages}",
            "mode=e2e",
            f"pipeline.schedule={schedule}",
            f"pipeline.microbatches={2 * a.stages}",
            f"pipeline.recompute={recompute}",
        ]
        + looped
        + [
            "model=mlp",
            f"model.width={a.width}",
            f"model.depth={a.depth}",
            "optim=sgd",
            "optim.lr=0.01",
            "data=synthetic",
            f"data.features={a.features}",
            "data.classes=10",
            f"data.samples={a.batch}",
            "data.val_fraction=0",
            f"data.batch_size={a.batch}",
            "data.shuffle=false",
            "trainer.progress=false",
        ]
    )


def worker(a: argparse.Namespace) -> None:
    """One measurement in this process: print {"peak_bytes", "stage_peaks", "seconds_per_step", "params"}
    as JSON (`stage_peaks`: each stage's device's peak; on CPU all the process's one figure)."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import ablations

    import chain
    from chain.pipeline.play import e2e_step
    from chain.planning import memory

    run = chain.build(chain.compose(overrides(a, a.schedule, a.recompute) + a.extra))
    if a.unchained:  # the same step without the per-stage order: each action waits for nothing
        st = run.strategy
        build = lambda: e2e_step(run.stages, run.schedule, st.loss_fn(), st.target)  # noqa: E731
        st.set_step(ablations.ablated_step(build, ablations.UNORDERED))
    it = iter(run.batches())
    for _ in range(a.warmup):
        run.step(*next(it))
    devices = [s.device for s in run.stages]
    memory.reset(devices)
    started = time.perf_counter()
    for _ in range(a.steps):
        run.step(*next(it))
    seconds = (time.perf_counter() - started) / a.steps
    peaks = [memory.peak_bytes(d) for d in devices]
    if None in peaks or (all(memory.scope(d) == "process" for d in devices) and len(set(peaks)) != 1):
        raise SystemExit(f"expected a peak per device (one process-wide figure on CPU), got {peaks}")
    params = sum(s.params for s in run.stages)
    estimate = [f.total for f in run.assignment.footprints]  # chain.planning.footprint, before training
    print(
        json.dumps(
            {
                "peak_bytes": max(peaks),
                "stage_peaks": peaks,
                "seconds_per_step": seconds,
                "params": params,
                "estimate_bytes": sum(estimate),
                "stage_estimates": estimate,
            }
        )
    )


def trace(a: argparse.Namespace) -> None:
    """What is live at the peak of one step (`--schedule`, `--recompute`), tensor by tensor: the
    chain's warm-up steps, then one step under TensorFlow's profiler, whose allocator events
    `chain.pipeline.memory_trace` reads back. Prints the breakdown by category (requested and
    allocated bytes), the largest ops of each, and the allocator's own peak of that step."""
    # The BFC allocator records every allocation in the trace on CPU; set before TensorFlow starts.
    os.environ.setdefault("TF_CPU_ALLOCATOR_USE_BFC", "true")
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import tempfile

    import tensorflow as tf

    import chain
    from chain.pipeline import memory_trace, timeline
    from chain.planning import memory

    if a.warmup < 1:
        raise SystemExit("--trace: --warmup must be at least 1 (the first step traces the function)")
    run = chain.build(chain.compose(overrides(a, a.schedule, a.recompute) + a.extra))
    if a.weights_late:  # the step as it was: a backward's weight products queued behind its input gradients
        import ablations

        from chain.pipeline.play import e2e_step

        st = run.strategy
        build = lambda: e2e_step(run.stages, run.schedule, st.loss_fn(), st.target, recompute_policy=a.recompute)  # noqa: E731
        st.set_step(ablations.ablated_step(build, ablations.WEIGHTS_LATE))
    it = iter(run.batches())
    for _ in range(a.warmup - 1):
        run.step(*next(it))
    devices = [s.device for s in run.stages]
    with tempfile.TemporaryDirectory() as logdir:
        # The last warm-up step is traced too, to name what a step leaves for the next (the
        # iterator's next batch); the breakdown is the measured step's peak.
        tf.profiler.experimental.start(logdir)
        with tf.profiler.experimental.Trace(timeline.MARKER, step_num=0, _r=1):
            run.step(*next(it))
        memory.reset(devices)
        with tf.profiler.experimental.Trace(timeline.MARKER, step_num=1, _r=1):
            run.step(*next(it))
        tf.profiler.experimental.stop()
        peak = memory_trace.peak_of(logdir, step=1)
    measured = max(memory.peak_bytes(d) or 0 for d in devices)
    mib = 2.0**20
    print(
        f"{a.schedule} recompute={a.recompute}{' weights late' if a.weights_late else ''}: allocator peak of the traced step {measured / mib:.2f} MiB, "
        f"traced peak {peak.in_use / mib:.2f} MiB; weights {4 * sum(s.params for s in run.stages) / mib:.2f} MiB; "
        f"estimate {sum(f.total for f in run.assignment.footprints) / mib:.2f} MiB (chain.planning.footprint)"
    )
    print("\n".join(memory_trace.table(peak)))
    for name in memory_trace.CATEGORIES[1:]:
        ops = peak.by_op(name)
        if ops:
            top = ", ".join(f"{op} {r / mib:.2f}/{b / mib:.2f}" for op, (r, b) in list(ops.items())[: a.top])
            print(f"  {name}: {len(ops)} ops; largest (requested/allocated MiB): {top}")


def paired_times(a: argparse.Namespace) -> None:
    """Step time of each recompute policy against `never`, in one process: one chain, one step
    per policy over the same stages (`Strategy.set_step`), played in turn step by step, so each
    ratio compares steps a moment apart. Prints the median ratio per schedule and policy."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import chain
    from chain.schedule import schedules
    from chain.pipeline.play import e2e_step

    run = chain.build(chain.compose(overrides(a, SCHEDULES[0]) + a.extra))
    st = run.strategy
    it = iter(run.batches())
    batch = next(it)
    for schedule in SCHEDULES:
        plan = schedules.build(schedule, a.stages, 2 * a.stages)
        fns = {}
        for policy in RECOMPUTE:
            st.set_step(e2e_step(run.stages, plan, st.loss_fn(), st.target, recompute_policy=policy))
            for _ in range(a.warmup):
                run.step(*batch)
            fns[policy] = (st.step_fn, st._concrete)
        times: dict[str, list[float]] = {p: [] for p in RECOMPUTE}
        cpu: dict[str, list[float]] = {p: [] for p in RECOMPUTE}  # the process's CPU seconds: the work done,
        for _ in range(a.steps):  # which other jobs on the machine change less than the wall clock
            for policy in RECOMPUTE:
                st.step_fn, st._concrete = fns[policy]
                started, started_cpu = time.perf_counter(), time.process_time()
                run.step(*batch)
                times[policy].append(time.perf_counter() - started)
                cpu[policy].append(time.process_time() - started_cpu)
        for policy in RECOMPUTE[1:]:
            ratio = statistics.median(t / n for t, n in zip(times[policy], times["never"]))
            cpu_ratio = statistics.median(t / n for t, n in zip(cpu[policy], cpu["never"]))
            print(
                f"{schedule} {policy}: step time / never's, median of {a.steps} paired ratios: {ratio:.2f} "
                f"(never median {statistics.median(times['never']):.3f} s); CPU time / never's: {cpu_ratio:.2f}",
                flush=True,
            )


def measure(a: argparse.Namespace, variant: str) -> dict:
    """One variant ("gpipe", "1f1b always", "gpipe unchained") measured in a fresh process."""
    schedule, _, rest = variant.partition(" ")
    unchained = rest == "unchained"
    recompute = rest if rest in RECOMPUTE else "never"
    cmd = (
        [sys.executable, os.path.abspath(__file__), "--worker", "--schedule", schedule, "--recompute", recompute]
        + (["--unchained"] if unchained else [])
        + [f"--extra={e}" for e in a.extra]
        + [f"--{k}={getattr(a, k)}" for k in ("stages", "width", "depth", "features", "batch", "warmup", "steps")]
    )
    # The BFC allocator keeps the peak on any CPU (as the command line sets it: chain.cli).
    env = dict(
        os.environ,
        TF_CPP_MIN_LOG_LEVEL="2",
        TF_CPU_ALLOCATOR_USE_BFC=os.environ.get("TF_CPU_ALLOCATOR_USE_BFC", "true"),
    )
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT)
    if r.returncode:
        raise SystemExit(f"worker failed ({variant}):\n{r.stderr}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def plan(schedule: str, stages: int, microbatches: int):
    """The schedule as the benchmark runs it (interleaved: `VIRTUAL` stages per device)."""
    from chain.schedule import schedules

    devices = stages // VIRTUAL if schedule == "interleaved" else None
    return schedules.build(schedule, stages, microbatches, devices)


def live_microbatches(schedule: str, stages: int, microbatches: int) -> int:
    """Microbatch activations held at once, summed over devices, by the schedule itself."""
    from chain.schedule import schedules

    return sum(max(schedules.live_activations(row)) for row in plan(schedule, stages, microbatches).actions)


def held_per_stage(schedule: str, stages: int, microbatches: int) -> list[int]:
    """Per stage, the most microbatches whose activations it holds at once (1F1B: min(M, K-k))."""
    from chain.schedule import schedules

    return schedules.held_counts(plan(schedule, stages, microbatches))


def pending_weight_gradients(schedule: str, stages: int, microbatches: int) -> list[int]:
    """Per stage, the most microbatches between their B and their W at once (zb1: what B leaves for W,
    the gradients at every layer's output; 0 for a schedule without W)."""
    from chain.schedule.schedules import BACKWARD, WEIGHT

    s, out = plan(schedule, stages, microbatches), []
    for k in range(stages):
        pending, most = 0, 0
        for action in s.actions[s.row(k)]:
            if action.stage == k:
                pending += 1 if action.kind == BACKWARD else -1 if action.kind == WEIGHT else 0
                most = max(most, pending)
        out.append(most if any(x.kind == WEIGHT for x in s.actions[s.row(k)]) else 0)
    return out


def fixed_bytes(results: dict[str, list[dict]]) -> int:
    """The float32 weights and their gradient sums (SGD: no optimizer slots): what every row holds
    whatever its schedule; the peak less this is read as activation memory."""
    return 2 * 4 * results[SCHEDULES[0]][0]["params"]


def report(a: argparse.Namespace, results: dict[str, list[dict]]) -> str:
    """The docs/benchmarks.md section (Markdown)."""
    m = 2 * a.stages
    med = {s: statistics.median(r["peak_bytes"] for r in results[s]) for s in results}
    sec = {s: statistics.median(r["seconds_per_step"] for r in results[s]) for s in results}
    mib = lambda b: f"{b / 2**20:.1f}"  # noqa: E731
    act_mb = a.batch // m * a.width * 4 / 2**20
    fixed = fixed_bytes(results)
    known = SCHEDULES + SPLIT_AND_LOOPED
    lines = [
        f"<!-- {SECTION}:start -->",
        "## Pipeline memory: GPipe, 1F1B, zb1, interleaved (`scripts/bench_pipeline_memory.py`)",
        "",
        f"Chain: {a.stages} stages of `mlp(width={a.width}, depth={a.depth})` on `synthetic` "
        f"({a.features} features), SGD, batch {a.batch} in M = 2K = {m} microbatches "
        f"({a.batch // m} examples, {act_mb:.2f} MiB per {a.width}-wide activation), "
        f"{results[SCHEDULES[0]][0]['params']:,} parameters; interleaved: the same {a.stages} stages on "
        f"{a.stages // VIRTUAL} devices (`pipeline.virtual_stages={VIRTUAL}`, stage k on device k mod {a.stages // VIRTUAL}). "
        f"Peak of the process's CPU allocator over {a.steps} steps after {a.warmup} warm-up steps, "
        f"each schedule in its own process, {a.repeats} repeat{'s' if a.repeats > 1 else ''}, median. Activations: the peak less the "
        f"weights and their gradient sums ({mib(fixed)} MiB, the same in every row). "
        f"Machine: {os.cpu_count()} CPU cores, logical CPU devices (shared with other jobs while measured).",
        "",
        "| schedule | microbatches held per stage (the schedule's bound) | held, sum | peak memory, MiB (median) "
        "| all repeats, MiB | activations, MiB | s/step (median) | estimate, MiB (sum over stages) | estimate / peak |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for s in [v for v in results if v.rpartition(" ")[2] not in RECOMPUTE[1:]]:
        runs = ", ".join(mib(r["peak_bytes"]) for r in results[s])
        bound = ", ".join(map(str, held_per_stage(s, a.stages, m))) if s in known else "not enforced"
        held = live_microbatches(s, a.stages, m) if s in known else "-"
        est = results[s][0].get("estimate_bytes") if s in known else None
        cols = f"{mib(est)} | {est / med[s]:.2f}" if est else "- | -"
        lines.append(
            f"| {s} | {bound} | {held} | {mib(med[s])} | {runs} | {mib(med[s] - fixed)} | {sec[s]:.2f} | {cols} |"
        )
    lines += [
        "",
        f"1F1B / GPipe peak memory: **{med['1f1b'] / med['gpipe']:.2f}**, activations "
        f"{(med['1f1b'] - fixed) / (med['gpipe'] - fixed):.2f} "
        f"(schedule's own count of held microbatches: "
        f"{live_microbatches('1f1b', a.stages, m) / live_microbatches('gpipe', a.stages, m):.2f}; "
        "weights, gradient accumulators and the batch are the same in both). 1F1B's bound is min(M, K-k) "
        "microbatches on stage k, the column above.",
        "",
        "The estimate is what the preparation pass computes before training (`chain.planning.footprint`, "
        "summed over the stages: logical CPUs share one allocator, so the process's one peak is compared "
        "with the sum); issue 21's goal is within 25% of the measured peak.",
        "",
        "1F1B saves less than the count of held microbatches suggests: the weights, counted in the peak, "
        "are the same for both, and (traced with `--trace`, docs/benchmarks.md) GPipe peaks as its first "
        "backwards start, with few gradient sums allocated yet, while 1F1B peaks in its steady state, with "
        "every stage's sums allocated; both also hold the input pipeline's prefetched batches (2-2.6 MiB here).",
        "",
    ]
    if all(s in results for s in ("zb1", "interleaved")):
        lines += new_schedules(a, results, med, fixed)
    if not a.no_recompute:
        lines += recompute_rows(a, results)
    if a.ablation:
        lines += [
            "The *unchained* rows remove the per-stage control dependencies between "
            "consecutive actions: the executor then runs each op as soon as its inputs are "
            f"ready, both schedules behave alike ({mib(med['gpipe unchained'])} and "
            f"{mib(med['1f1b unchained'])} MiB) and 1F1B's bound is gone. The chaining, not the "
            "order actions are traced in, is what makes a schedule hold.",
            "",
        ]
    lines += [
        f"Measured {time.strftime('%Y-%m-%d')} with `python scripts/bench_pipeline_memory.py "
        f"--repeats {a.repeats} --stages {a.stages} --width {a.width} --depth {a.depth} --batch {a.batch}"
        + (" --ablation" if a.ablation else "")
        + (" --no-recompute" if a.no_recompute else "")
        + "`.",
        f"<!-- {SECTION}:end -->",
    ]
    return "\n".join(lines) + "\n"


def new_schedules(
    a: argparse.Namespace, results: dict[str, list[dict]], med: dict[str, float], fixed: int
) -> list[str]:
    """What zb1 and interleaved hold, against 1F1B: zb1's layer-output gradients between B and W."""
    m = 2 * a.stages
    mib = lambda b: f"{b / 2**20:.1f}"  # noqa: E731
    pending = pending_weight_gradients("zb1", a.stages, m)
    # B leaves the gradient at every weighted layer's output (`chain.steps.forward.Kept`): depth
    # width-wide outputs per stage, and the read-out's (classes wide) on the last one.
    per_microbatch = [
        a.batch // m * 4 * (a.depth * a.width + (10 if k == a.stages - 1 else 0)) for k in range(a.stages)
    ]
    grads = sum(p * b for p, b in zip(pending, per_microbatch))
    act = {s: med[s] - fixed for s in ("1f1b", "zb1", "interleaved")}
    return [
        f"zb1 against 1F1B: activations {mib(act['zb1'])} against {mib(act['1f1b'])} MiB "
        f"({act['zb1'] / act['1f1b']:.2f}). zb1's W runs after its B and reads what the forward "
        "kept, so its activations live until W (the held column counts them so), and between B and W "
        "it also holds the gradients B computed at every layer's output, as large as the layer outputs "
        f"themselves: up to {', '.join(map(str, pending))} microbatches at once on stages 0..{a.stages - 1} "
        f"(the schedule's count), {mib(per_microbatch[0])} MiB per microbatch on a stage here, "
        f"{mib(grads)} MiB if every stage's most were held at the same moment.",
        "",
        f"Interleaved against 1F1B: activations {mib(act['interleaved'])} against {mib(act['1f1b'])} MiB "
        f"({act['interleaved'] / act['1f1b']:.2f}); the schedule holds "
        f"{live_microbatches('interleaved', a.stages, m)} stage-microbatches at once in all "
        f"(1F1B {live_microbatches('1f1b', a.stages, m)}), on {a.stages // VIRTUAL} devices instead of "
        f"{a.stages}: per device, the most is {max(max(held_on_devices('interleaved', a.stages, m)), 0)} "
        f"(1F1B's stage 0: {held_per_stage('1f1b', a.stages, m)[0]}).",
        "",
    ]


def held_on_devices(schedule: str, stages: int, microbatches: int) -> list[int]:
    """Per device (row), the most stage-microbatches whose activations it holds at once."""
    from chain.schedule import schedules

    return [max(schedules.live_activations(row)) for row in plan(schedule, stages, microbatches).actions]


def recompute_rows(a: argparse.Namespace, results: dict[str, list[dict]]) -> list[str]:
    """The pipeline.recompute part of the section: each policy's peak and step time against
    `never` of the same schedule, as medians of the ratios within each repeat (the variants of
    one repeat ran back to back, so they saw the same machine), and GPipe's `always` against
    issue 21's goal and against what it must keep."""
    mib = lambda b: f"{b / 2**20:.1f}"  # noqa: E731
    m = 2 * a.stages
    fixed = fixed_bytes(results)
    lines = [
        "### Activation recomputation (`pipeline.recompute`)",
        "",
        "Each stage keeps only its input per microbatch and runs its forward again in the backward "
        "(`always`), or does so for all but each round's last microbatch (`except_last`); the last stage "
        "keeps a microbatch whose backward is its next action (every one under 1F1B: "
        "`schedules.backward_at_once`). Ratios are medians over repeats of the ratio to `never` of the "
        "same schedule measured in the same repeat (step times: in separate processes, see `--paired`).",
        "",
        "| schedule | recompute | peak memory, MiB (median) | activations, MiB | peak / never's | activations / never's "
        "| step time / never's | estimate / peak |",
        "|---|---|---|---|---|---|---|---|",
    ]
    act: dict[tuple[str, str], float] = {}
    for schedule in SCHEDULES:
        base = results[schedule]
        for r in RECOMPUTE:
            runs = base if r == "never" else results[f"{schedule} {r}"]
            peak = statistics.median(x["peak_bytes"] for x in runs)
            act[(schedule, r)] = peak - fixed
            pr = statistics.median(x["peak_bytes"] / b["peak_bytes"] for x, b in zip(runs, base))
            ar = statistics.median((x["peak_bytes"] - fixed) / (b["peak_bytes"] - fixed) for x, b in zip(runs, base))
            tr = statistics.median(x["seconds_per_step"] / b["seconds_per_step"] for x, b in zip(runs, base))
            est = runs[0].get("estimate_bytes")
            lines.append(
                f"| {schedule} | {r} | {mib(peak)} | {mib(peak - fixed)} | {pr:.2f} | {ar:.2f} | {tr:.2f} | "
                f"{f'{est / peak:.2f}' if est else '-'} |"
            )
    inputs = a.batch * (a.features + a.width * (a.stages - 1)) * 4  # every stage's input, all M microbatches
    never = act[("gpipe", "never")]
    one = never / m  # one microbatch's activations, every stage: what the replays rebuild if all run at once
    always = act[("gpipe", "always")]
    lines += [
        "",
        f"Issue 21's goal for GPipe `always`: at most 1/M of `never`'s activations plus one microbatch's, "
        f"{mib(never)} / {m} + {mib(one)} = **{mib(never / m + one)} MiB** (one microbatch's read as every "
        f"stage's, since each stage may replay one at the same moment). Measured: **{mib(always)} MiB** "
        f"({always / (never / m + one):.2f} of the goal). What `always` must keep is every stage's input "
        f"for every microbatch, {mib(inputs)} MiB here, and while replaying one microbatch's intermediates "
        f"per stage ({mib(one)} MiB): {mib(inputs + one)} MiB in all. The peak less weights and sums also "
        f"counts what is not an activation (the input pipeline's batches) and leaves out sums GPipe `never` "
        f"has not allocated at its peak: what is live at the peak, tensor by tensor, is `--trace`'s "
        f"(docs/benchmarks.md). With {a.depth} layers per stage a stage's input is "
        f"about 1/{a.depth + 1} of the layer outputs it would keep; the goal can hold only where that share "
        f"is near 1/M or less.",
        "",
    ]
    return lines


def write_section(path: str, section: str) -> None:
    """Replace this benchmark's section of `path` (or append it), keeping everything else."""
    start, end = f"<!-- {SECTION}:start -->", f"<!-- {SECTION}:end -->"
    text = (
        open(path).read()
        if os.path.exists(path)
        else "# Benchmarks\n\nFigures measured by the scripts in `scripts/`.\n"
    )
    if start in text and end in text:
        head, rest = text.split(start, 1)
        tail = rest.split(end, 1)[1].lstrip("\n")
        text = head + section + ("\n" + tail if tail else "")
    else:
        text = text.rstrip("\n") + "\n\n" + section
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        f.write(text)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--stages", type=int, default=4)
    p.add_argument("--width", type=int, default=512)
    p.add_argument("--depth", type=int, default=2)
    p.add_argument("--features", type=int, default=64)
    p.add_argument("--batch", type=int, default=2048)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--out", default=os.path.join(ROOT, "docs", "benchmarks.md"))
    p.add_argument("--ablation", action="store_true", help="also measure without per-stage control dependencies")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--unchained", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--schedule", choices=SCHEDULES + SPLIT_AND_LOOPED, default="gpipe", help="--trace: the schedule")
    p.add_argument("--recompute", choices=RECOMPUTE, default="never", help="--trace: the recompute policy")
    p.add_argument(
        "--extra",
        action="append",
        default=[],
        help="one more override for the chain (repeatable), e.g. --extra=placement.devices=[/GPU:0,/GPU:1]",
    )
    p.add_argument(
        "--paired",
        action="store_true",
        help="only step times of each recompute policy against never, "
        "interleaved step by step in one process (--steps pairs)",
    )
    p.add_argument("--no-recompute", action="store_true", help="leave out the pipeline.recompute rows")
    p.add_argument("--no-split-or-looped", action="store_true", help="leave out the zb1 and interleaved rows")
    p.add_argument(
        "--trace",
        action="store_true",
        help="only trace one step of --schedule/--recompute after "
        "warm-up and print what is live at its peak, by category (chain.pipeline.memory_trace)",
    )
    p.add_argument(
        "--weights-late",
        action="store_true",
        help="--trace: the step without `weights_first`'s "
        "and `summed_in_turn`'s edges (scripts/ablations.py: WEIGHTS_LATE), as it was before them",
    )
    p.add_argument("--top", type=int, default=4, help="--trace: how many of each category's largest ops to name")
    a = p.parse_args()
    if a.trace:
        trace(a)
        return
    if a.worker:
        worker(a)
        return
    if a.paired:
        paired_times(a)
        return
    variants = (
        list(SCHEDULES)
        + ([] if a.no_split_or_looped else list(SPLIT_AND_LOOPED))
        + ([] if a.no_recompute else [f"{s} {r}" for s in SCHEDULES for r in RECOMPUTE[1:]])
        + ([f"{s} unchained" for s in SCHEDULES] if a.ablation else [])
    )
    results: dict[str, list[dict]] = {s: [] for s in variants}
    for r in range(a.repeats):
        for s in variants if r % 2 == 0 else variants[::-1]:
            results[s].append(measure(a, s))
            print(
                f"repeat {r + 1}/{a.repeats}  {s:6s} peak {results[s][-1]['peak_bytes'] / 2**20:8.1f} MiB  "
                f"{results[s][-1]['seconds_per_step']:.2f} s/step",
                flush=True,
            )
    med = {s: statistics.median(x["peak_bytes"] for x in results[s]) for s in variants}
    for s in variants[len(SCHEDULES) :]:
        print(f"median peak  {s}: {med[s] / 2**20:.1f} MiB")
    print(
        f"\nmedian peak  gpipe {med['gpipe'] / 2**20:.1f} MiB   1f1b {med['1f1b'] / 2**20:.1f} MiB   "
        f"1f1b/gpipe {med['1f1b'] / med['gpipe']:.2f}"
    )
    write_section(a.out, report(a, results))
    print(f"written to {a.out}")


if __name__ == "__main__":
    main()
