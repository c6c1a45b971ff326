"""Pipeline speed-up of the chain's own e2e step on K single-core TensorFlow workers.

    python scripts/bench_pipeline.py                                   # K=2, M in 1 2 4 8 16, 5 repeats
    python scripts/bench_pipeline.py --micro 8 16 --min-quiet 8 --ablations before --markdown
    python scripts/bench_pipeline.py --replicas --micro 8 16 32 --repeats 7  # data parallel x pipeline, 2 workers

Not a test: it prints a table (`--markdown` also prints one for docs/benchmarks.md).

On one machine, logical CPU devices share one thread pool: they show placement, never
overlap. Real overlap is measured with TensorFlow's distributed runtime: K workers
(`python -m chain.worker --cpus i --threads 1`: pinned to core i, one intra-op and one
inter-op thread) run one op at a time, like K accelerators with one stream each. This
process is the client: it builds the chain with `chain.build` and `cluster.workers=[...]`
(the trainer's own path: planner, stages on the workers' devices, the compiled e2e step,
the host releases of `chain.pipeline.play`) twice per schedule and M:

- `one`: every stage on worker 0 (`placement.devices=[/task:0/CPU:0,...]`), the baseline;
- `split`: stage k on worker k.

Steps timed: the chain's `gpipe` and `1f1b` (through `Run.strategy.call`, the call `fit`
makes); `hand`, a minimal GPipe step written by hand with the same model (per-microbatch
tapes, no control dependencies, plain SGD: what the runtime itself allows); with
`--ablations before`, the chain's steps without the host releases (`ablations.NO_RELEASES`,
scripts/ablations.py: the step as it was before them); with `--ablations every-send`, with a release after
every sending action (`ablations.EVERY_SEND`: the rule before `chain.pipeline.play.released`).

`interleaved` cuts the same layers into K x `--virtual` stages (each `--depth`/`--virtual` layers),
stage k on worker k mod K. `zbv` cuts them into 2K stages (each `--depth`/2 layers) in a V, stages k
and 2K-1-k on worker k (its first and last stages on worker 0). On one worker (the `one` baseline)
both run their cut with 1F1B: every stage on one device.

Schedules against each other (`--schedules 1f1b zb1 --against 1f1b`): for each M, the median
over repeats of time(1f1b, split) / time(zb1, split), both measured in the same repeat (one
after the other, their order alternating): above 1, zb1 is faster on the same workers.

Speed-up = time(one) / time(split): the median over repeats of each repeat's paired ratio
(both placements back to back, in alternating order). Ideal = K*M/(M+K-1), the pipeline
bubble's limit (1F1B's, GPipe's); efficiency = speed-up / ideal. Plan = K x (1 - the schedule's
planned bubble fraction, unit-time actions): the limit of that schedule's own order (zbv at K=2,
M=8: 1.96; the bubble-free limit is K). Each measurement records how much CPU other
processes took meanwhile (in cores; on a 2-core machine anything else running steals from a
worker, and from the split placement far more than from the one-worker baseline): the
table gives medians over all pairs and over the quiet ones (other processes below
`--quiet` cores during both runs); `--min-quiet N` repeats until every row has N quiet
pairs (or `--max-minutes`). On a shared machine, trust the quiet columns.

Copies of the pipeline (`--replicas`, `placement.replicas`): the same layers (`--stages` x `--depth`)
and the same global batch (`--micro-size` x M) three ways on two single-core workers, each repeat
timing the three back to back in rotating order:

- `one`: the whole model as one stage on worker 0 (K=1, R=1, one microbatch: the whole batch), the reference;
- `data`: two copies of that one stage, one per worker, each half the batch as one microbatch
  (K=1, R=2, pipeline.microbatches=1: what a user runs, a single stage needs no microbatches);
- `pipe`: the model cut into two stages, one per worker, M microbatches (K=2, R=1).

M sets the global batch (`--micro-size` x M) of all three. `--decompose` adds, in the same rotation,
`half` (one copy's half batch alone on worker 0: what each copy computes), `apart` (`data` with
its reduction left out: each copy updates from its own gradients, no exchange; not training),
`bf16` (`data` with `placement.exchange_dtype=bfloat16`: half the bytes, rounded) and
`owner` (`data` with each gradient summed by one copy, which sends the mean back:
`Replicated.reduction`), with their time ratios to `data`. Every case also prints the CPU time
(ms per step, median over repeats) of this process and of each worker: on single-core workers the
exchange's serialization and socket copies run on the worker's one core, so `data` minus `apart`
in a worker's CPU time is what the exchange costs it, overlapped or not.

The batch starts on this process (the client), as `Run` feeds it, so every case pays for sending
it out. Scaling efficiency, as the anchors define it, is throughput with 2 workers / (2 x
throughput with 1) = time(one) / (2 x time(case)), paired within a repeat; the table gives the
median over repeats (and over the quiet ones).

Model (the issue's): K=2 stages of 4 Dense layers of width 1024 with tanh, microbatch 128
examples (batch 128*M), SGD, float32; the last stage adds the 10-class read-out and the loss.
The workers get SIGTERM when the run ends, however it ends.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

from chain.schedule.schedules import NAMES
from chain.worker import LocalCluster

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

# What --schedules takes (bench_bubble.py too): every built-in schedule but sequential, which overlaps nothing
SCHEDULES = [name for name in NAMES if name != "sequential"]


def overrides(a, addresses: list[str], schedule: str, m: int, devices: list[str]) -> list[str]:
    """The benchmark's chain (see the module docstring) on these workers and devices. Interleaved:
    the same layers cut into `--virtual` times as many stages, stage k on worker k mod K; zbv: cut
    into 2K stages, stages k and 2K-1-k on worker k (on one worker, the `one` baseline runs either
    cut with 1F1B: every stage on one device)."""
    stages, depth, extra = a.stages, a.depth, []
    if schedule in ("interleaved", "zbv"):
        v = a.virtual if schedule == "interleaved" else 2
        stages, depth = a.stages * v, a.depth // v
        devices = (
            [d for _ in range(v) for d in devices] if schedule == "interleaved" else devices + devices[::-1]
        )  # the V: worker k holds stages k and 2K-1-k
        if len(set(devices)) == 1:
            schedule = "1f1b"
        elif schedule == "interleaved":
            extra = [f"pipeline.virtual_stages={v}"]
    cut = f"+stages={stages}"
    if getattr(a, "first_extra", 0):  # the first stage deeper: it computes no gradient for its input
        cut = (
            "+stages=["
            + ",".join(f"{{model: {{depth: {depth + (a.first_extra if k == 0 else 0)}}}}}" for k in range(stages))
            + "]"
        )
    return [
        cut,
        "mode=e2e",
        f"pipeline.schedule={schedule}",
        f"pipeline.microbatches={m}",
        *extra,
        "model=mlp",
        f"model.width={a.width}",
        f"model.depth={depth}",
        "model.activation=tanh",
        "optim=sgd",
        "optim.lr=0.001",
        "data=synthetic",
        f"data.features={a.width}",
        "data.classes=10",
        f"data.samples={a.micro_size * m}",
        "data.val_fraction=0",
        f"data.batch_size={a.micro_size * m}",
        "trainer.progress=false",
        f"cluster.workers=[{','.join(addresses)}]",
        f"placement.devices=[{','.join(devices)}]",
    ]


def chain_run(a, addresses: list[str], schedule: str, m: int, devices: list[str]):
    import chain

    return chain.build(chain.compose(overrides(a, addresses, schedule, m, devices)))


def ablated(run, ablation: str):
    """The same run's step built as `ablation` says: `before`, without the host releases; `every-send`, with a
    release after every sending action (before a receiving forward too: the rule before `play.released`)."""
    import ablations
    import tensorflow as tf

    from chain.pipeline.play import e2e_step

    s = run.strategy
    patch = {"before": ablations.NO_RELEASES, "every-send": ablations.EVERY_SEND}[ablation]
    body = ablations.ablated_step(lambda: e2e_step(run.stages, run.schedule, s.loss_fn(), s.target), patch)
    fn = tf.function(body)
    return lambda x, ys: fn(*s.arguments(x, ys)).numpy()


def hand_step(a, devices: list[str], m: int):
    """A minimal GPipe step written by hand: the same model and work, no control dependencies."""
    import keras
    import tensorflow as tf

    keras.utils.set_random_seed(0)
    models = []
    for k, d in enumerate(devices):
        with tf.device(d):
            depth = a.depth + (getattr(a, "first_extra", 0) if k == 0 else 0)
            layers = [keras.Input((a.width,))] + [keras.layers.Dense(a.width, activation="tanh") for _ in range(depth)]
            if k == len(devices) - 1:
                layers.append(keras.layers.Dense(10))
            models.append(keras.Sequential(layers))
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    last = len(devices) - 1

    @tf.function
    def step(x, ys):
        with tf.device(devices[0]):
            xs = tf.split(x, m)
        with tf.device(devices[last]):
            labels = tf.split(ys["label"], m)
        tapes, ins, outs = {}, {}, {}
        for mb in range(m):
            h = xs[mb]
            for k, (d, model) in enumerate(zip(devices, models)):
                with tf.device(d):
                    h = tf.identity(h)
                    with tf.GradientTape() as tape:
                        if k > 0:
                            tape.watch(h)
                        out = model(h, training=True)
                        if k == last:
                            out = loss_fn(labels[mb], out) / m
                    tapes[k, mb], ins[k, mb], outs[k, mb] = tape, h, out
                h = out
        acc = [None] * len(devices)
        for mb in range(m):
            g = None
            for k in reversed(range(len(devices))):
                with tf.device(devices[k]):
                    if g is not None:
                        g = tf.identity(g)
                    sources = ([ins[k, mb]] if k > 0 else []) + models[k].trainable_variables
                    grads = tapes[k, mb].gradient(outs[k, mb], sources, output_gradients=g)
                    if k > 0:
                        g, grads = grads[0], grads[1:]
                    acc[k] = grads if acc[k] is None else [p + q for p, q in zip(acc[k], grads)]
        for k, d in enumerate(devices):
            with tf.device(d):
                for var, grad in zip(models[k].trainable_variables, acc[k]):
                    var.assign_sub(0.001 * grad)
        with tf.device(devices[last]):
            return tf.add_n([outs[last, mb] for mb in range(m)])

    return lambda x, ys: step(x, ys).numpy()


def batch(a, m: int, devices: list[str]):
    """A batch of micro_size*M examples, already on the first stage's device (labels on the last's)."""
    import tensorflow as tf

    n = a.micro_size * m
    with tf.device(devices[0]):
        x = tf.random.stateless_normal([n, a.width], seed=[1, m])
    with tf.device(devices[-1]):
        y = tf.random.stateless_uniform([n], seed=[2, m], maxval=10, dtype=tf.int32)
    return x, {"label": y}


def cpu_ticks(pids: list[int]) -> tuple[int, int]:
    """(busy ticks of the whole machine, ticks used by `pids`), from /proc."""
    fields = open("/proc/stat").readline().split()[1:]
    busy = sum(int(f) for f in fields) - int(fields[3]) - int(fields[4])  # all but idle and iowait
    ours = 0
    for pid in pids:
        try:
            stat = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
            ours += int(stat[11]) + int(stat[12])  # utime, stime
        except OSError:
            pass
    return busy, ours


def process_ms(pids: list[int]) -> list[float]:
    """CPU time (user + system, ms) each of `pids` has used so far, from /proc (0 for one that is gone)."""
    out = []
    for pid in pids:
        try:
            stat = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
            out.append((int(stat[11]) + int(stat[12])) * 1000 / os.sysconf("SC_CLK_TCK"))
        except OSError:
            out.append(0.0)
    return out


def timed_cpu(step, x, ys, n: int, pids: list[int]) -> tuple[float, float, list[float]]:
    """`timed`, and the CPU time (ms per step) each of `pids` used meanwhile: on single-core workers
    a transfer's serialization and copies run on the worker's one core, so its CPU time per step
    counts them whether or not they overlap with compute."""
    before = process_ms(pids)
    seconds, foreign = timed(step, x, ys, n, pids)
    return seconds, foreign, [(b - a) / n for a, b in zip(before, process_ms(pids))]


def timed(step, x, ys, n: int, pids: list[int]) -> tuple[float, float]:
    """(seconds per step over `n` steps, cores' worth of CPU other processes used meanwhile)."""

    def steps():
        for _ in range(n):
            step(x, ys)  # returns a NumPy value: each step has ended before the next starts

    seconds, foreign = foreign_cpu(steps, pids)
    return seconds / n, foreign


def foreign_cpu(fn, pids: list[int]) -> tuple[float, float]:
    """Run `fn()`: (seconds it took, cores' worth of CPU that processes other than `pids` used meanwhile)."""
    b0, o0 = cpu_ticks(pids)
    started = time.perf_counter()
    fn()
    seconds = time.perf_counter() - started
    b1, o1 = cpu_ticks(pids)
    return seconds, max(0, (b1 - b0) - (o1 - o0)) / os.sysconf("SC_CLK_TCK") / seconds


def quiet_pairs(a, one: list, split: list) -> list[float]:
    return [o[0] / s[0] for o, s in zip(one, split) if max(o[1], s[1]) < a.quiet]


def against(a, times: dict) -> list[dict]:
    """Each schedule against `--against` on the split placement: the median of the paired ratios
    time(against) / time(schedule), pairs taken from the same repeat (and quiet pairs apart)."""
    out = []
    for m in a.micro:
        base = times.get((a.against, m, "split"), [])
        for name in a.schedules:
            if name == a.against or (name, m, "split") not in times:
                continue
            pairs = list(zip(base, times[name, m, "split"]))
            quiet = [b[0] / t[0] for b, t in pairs if max(b[1], t[1]) < a.quiet]
            out.append(
                dict(
                    step=name,
                    M=m,
                    pairs=len(pairs),
                    ratio=statistics.median(b[0] / t[0] for b, t in pairs),
                    quiet=len(quiet),
                    quiet_ratio=statistics.median(quiet) if quiet else None,
                )
            )
    return out


REPLICA_CASES = {"one": (1, 1), "data": (1, 2), "pipe": (2, 1)}  # name -> (stages K, copies R) of `--replicas`
# `--replicas --decompose`: where the `data` case's time goes (not training cases a user runs).
# `half`: one copy alone on worker 0 with its half of the batch (what each copy computes, no exchange);
# `apart`: the `data` case with its reduction left out (each copy updates from its own gradients:
# wrong training, the two workers' compute and the client's feeding without the gradients' exchange).
# `owner`: the `data` case with each gradient averaged by one copy, which sends the mean back
# (`Replicated.reduction`: one sum per gradient instead of one per copy; the same bits).
# `bf16`: the `data` case with its gradients travelling as bfloat16 (`placement.exchange_dtype=bfloat16`:
# half the bytes, each copy's gradients rounded to 8 significant bits: not the float32 results).
DECOMPOSE = {"half": (1, 1), "apart": (1, 2), "owner": (1, 2), "bf16": (1, 2)}


def replica_overrides(a, addresses: list[str], k: int, r: int, m: int) -> list[str]:
    """`--replicas`: the benchmark's layers (`--stages` x `--depth`) cut into `k` stages, `r` copies,
    the global batch micro_size x `m` (M microbatches for a pipeline, one for a single stage)."""
    cut = argparse.Namespace(**{**vars(a), "stages": k, "depth": a.stages * a.depth // k})
    out = overrides(cut, addresses, "1f1b", m, [f"/task:{i}/CPU:0" for i in range(k)])
    out = [o.replace(f"pipeline.microbatches={m}", f"pipeline.microbatches={m if k > 1 else 1}") for o in out]
    if r > 1:  # the planner lays the copies over the workers in task order (placement.devices is per stage)
        out = [o for o in out if not o.startswith("placement.devices=")] + [f"placement.replicas={r}"]
    return out + ["cluster.lost_after_s=120"]  # a loaded machine's worker may not answer the watchdog for 5 s


def host_batch(a, m: int, share: int = 1):
    """A batch of micro_size*M examples (1/`share` of it) on this process's CPU (the client), where `Run`
    feeds it from."""
    import tensorflow as tf

    from chain.pipeline.play import host

    n = a.micro_size * m // share
    with tf.device(host()):
        x = tf.random.stateless_normal([n, a.width], seed=[1, m])
        y = tf.random.stateless_uniform([n], seed=[2, m], maxval=10, dtype=tf.int32)
    return x, {"label": y}


def replicas_main(a) -> None:
    """`--replicas`: K=1 R=1 on one worker against K=1 R=2 and K=2 R=1 on two (module docstring)."""
    import chain

    cores = [int(c) for c in a.cores.split(",")] if a.cores else [i % os.cpu_count() for i in range(2)]
    started = time.time()
    import chain.pipeline.replicas as replicas

    cases = {**REPLICA_CASES, **(DECOMPOSE if a.decompose else {})}
    with LocalCluster(2, cpus=cores, threads=1) as cluster:
        steps, batches = {}, {}
        for m in a.micro:
            for name, (k, r) in cases.items():
                batches[name, m] = host_batch(a, m, 2 if name == "half" else 1)
                options = replica_overrides(a, cluster.addresses, k, r, m)
                if name == "half":
                    options += [f"data.batch_size={a.micro_size * m // 2}"]
                if name == "bf16":
                    options += ["placement.exchange_dtype=bfloat16"]
                run = chain.build(chain.compose(options))
                if name == "owner":
                    run.strategy.reduction = "owner"
                steps[name, m] = run.strategy.call
                reduce = replicas.reduce_mean
                if name == "apart":  # traced on the first call: each copy keeps its own values
                    replicas.reduce_mean = lambda values, *_: list(values)
                try:
                    for _ in range(a.warmup):
                        steps[name, m](*batches[name, m])
                finally:
                    replicas.reduce_mean = reduce
        print(
            f"# 2 workers ({', '.join(cluster.addresses)}) on cores {cores}, one thread each; built and warmed up "
            f"in {time.time() - started:.0f} s",
            flush=True,
        )
        pids = [os.getpid(), *cluster.pids]
        times = {key: [] for key in steps}
        names = list(cases)
        for r in range(a.repeats):
            for i, m in enumerate(a.micro):
                shift = (r + i) % len(names)
                for name in names[shift:] + names[:shift]:
                    times[name, m].append(timed_cpu(steps[name, m], *batches[name, m], a.steps, pids))
            print(
                f"# repeat {r + 1} at {time.time() - started:.0f} s, load {open('/proc/loadavg').read().split()[0]}",
                flush=True,
            )
    load = " ".join(open("/proc/loadavg").read().split()[:3])
    print(
        f"\n{kernel_name()}; {a.stages * a.depth}x{a.width} tanh in all, global batch {a.micro_size} x M, {a.repeats} repeats x "
        f"{a.steps} steps, {time.time() - started:.0f} s; load average at the end {load}"
    )
    print(
        "scaling efficiency = time(one) / (2 x time(case)), paired per repeat, median; quiet: other processes "
        f"below {a.quiet} cores during both runs of a pair"
    )
    print(
        f"{'case':6s} {'K':>2s} {'R':>2s} {'M':>3s} {'one s':>8s} {'case s':>8s} {'effic.':>7s} {'quiet':>5s} "
        f"{'effic.':>7s}"
    )
    rows = []
    for m in a.micro:
        one = times["one", m]
        for name in names[1:]:
            k, r = cases[name]
            case = times[name, m]
            effic = [o[0] / (2 * c[0]) for o, c in zip(one, case)]
            quiet = [e for e, o, c in zip(effic, one, case) if max(o[1], c[1]) < a.quiet]
            row = dict(
                case=name,
                K=k,
                R=r,
                M=m,
                one_s=statistics.median(t[0] for t in one),
                case_s=statistics.median(t[0] for t in case),
                efficiency=statistics.median(effic),
                quiet=len(quiet),
                quiet_efficiency=statistics.median(quiet) if quiet else None,
            )
            rows.append(row)
            q = f"{row['quiet_efficiency']:7.3f}" if quiet else f"{'-':>7s}"
            print(
                f"{name:6s} {k:2d} {r:2d} {m:3d} {row['one_s']:8.4f} {row['case_s']:8.4f} {row['efficiency']:7.3f} "
                f"{row['quiet']:5d} {q}"
            )
    print(
        "CPU time per step, ms (median over repeats; client, worker 0, worker 1): "
        + "; ".join(
            f"{name} M={m}: " + ", ".join(f"{statistics.median(t[2][i] for t in times[name, m]):.0f}" for i in range(3))
            for m in a.micro
            for name in names
        )
    )
    if a.decompose:
        print(
            "decomposition, medians of paired ratios: "
            + "; ".join(
                f"M={m}: time(half) / time(data) {statistics.median(h[0] / d[0] for h, d in zip(times['half', m], times['data', m])):.3f}, "
                f"time(apart) / time(data) {statistics.median(p[0] / d[0] for p, d in zip(times['apart', m], times['data', m])):.3f}, "
                f"time(owner) / time(data) {statistics.median(p[0] / d[0] for p, d in zip(times['owner', m], times['data', m])):.3f}, "
                f"time(bf16) / time(data) {statistics.median(p[0] / d[0] for p, d in zip(times['bf16', m], times['data', m])):.3f}, "
                f"time(one) / (2 x time(half)) {statistics.median(o[0] / (2 * h[0]) for o, h in zip(times['one', m], times['half', m])):.3f}"
                for m in a.micro
            )
        )
    if a.markdown:
        print("\n| case | K | R | M | scaling efficiency (all pairs) | quiet pairs | scaling efficiency (quiet) |")
        print("|---|---|---|---|---|---|---|")
        for row in rows:
            q = f"{row['quiet_efficiency']:.2f}" if row["quiet"] else "-"
            print(
                f"| {row['case']} | {row['K']} | {row['R']} | {row['M']} | {row['efficiency']:.2f} | {row['quiet']} "
                f"| {q} |"
            )
    if a.json:
        with open(a.json, "w") as f:
            cpu = {
                f"{name} M={m}": [statistics.median(t[2][i] for t in times[name, m]) for i in range(3)]
                for m in a.micro
                for name in names
            }
            json.dump(dict(args=vars(a), load=load, rows=rows, cpu_ms_per_step=cpu), f, indent=1)
    sys.stdout.flush()
    os._exit(0)  # as main: skip the runtime's teardown RPCs to the stopped workers


def model_arguments(p: argparse.ArgumentParser) -> None:
    """The options that shape the benchmark's chain (`overrides`)."""
    p.add_argument("--stages", type=int, default=2)
    p.add_argument("--depth", type=int, default=4)
    p.add_argument("--width", type=int, default=1024)
    p.add_argument("--micro-size", type=int, default=128, help="examples per microbatch")
    p.add_argument("--virtual", type=int, default=2, help="interleaved: stages per worker (--depth must divide by it)")
    p.add_argument(
        "--first-extra",
        type=int,
        default=0,
        help="layers added to the first stage (of every cut), which computes no input gradient: a "
        "balanced pipeline (0: every stage --depth layers, --depth/--virtual interleaved)",
    )
    p.add_argument(
        "--onednn",
        action="store_true",
        help="the workers use TensorFlow's oneDNN kernels (TF_ENABLE_ONEDNN_OPTS=1; TensorFlow's default "
        "only on x86 CPUs with AVX512-VNNI or AMX), not its Eigen kernels",
    )


def kernels(a) -> str:
    """Set the kernels the workers (started after this) use, from `--onednn`; their name, for the printout."""
    if a.onednn:
        os.environ["TF_ENABLE_ONEDNN_OPTS"] = "1"
    return kernel_name()


def kernel_name() -> str:
    """The kernels this process's workers use, as `kernels` set them."""
    return {"1": "oneDNN kernels", "0": "Eigen kernels"}.get(
        os.environ.get("TF_ENABLE_ONEDNN_OPTS"), "TensorFlow's default kernels"
    )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    model_arguments(p)
    p.add_argument("--micro", type=int, nargs="+", default=[1, 2, 4, 8, 16], help="microbatch counts M")
    p.add_argument("--schedules", nargs="+", default=["gpipe", "1f1b"], choices=SCHEDULES)
    p.add_argument("--against", default="", help="a schedule of --schedules: the others' paired ratios to it (split)")
    p.add_argument("--ablations", nargs="*", default=[], choices=["before", "every-send"])
    p.add_argument("--no-hand", dest="hand", action="store_false", help="skip the hand-written reference")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--steps", type=int, default=1, help="timed steps per measurement")
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--min-quiet", type=int, default=0, help="repeat until every row has this many quiet pairs")
    p.add_argument("--max-minutes", type=float, default=30)
    p.add_argument("--quiet", type=float, default=0.2, help="foreign CPU (cores) below which a pair is quiet")
    p.add_argument("--cores", default="", help="worker i's core, comma-separated (default: core i)")
    p.add_argument("--json", default="")
    p.add_argument("--markdown", action="store_true")
    p.add_argument(
        "--replicas",
        action="store_true",
        help="copies of the pipeline: K=1 R=1 on one worker against K=1 R=2 and K=2 R=1 on two",
    )
    p.add_argument(
        "--decompose",
        action="store_true",
        help="--replicas: also time `half` (one copy's share alone) and `apart` (data without its exchange)",
    )
    a = p.parse_args()
    kernels(a)  # before the workers start: they inherit it
    if a.replicas:
        return replicas_main(a)
    k = a.stages
    cores = [int(c) for c in a.cores.split(",")] if a.cores else [i % os.cpu_count() for i in range(k)]
    started = time.time()
    with LocalCluster(k, cpus=cores, threads=1) as cluster:
        addresses, worker_pids = cluster.addresses, cluster.pids
        placements = {"one": ["/task:0/CPU:0"] * k, "split": [f"/task:{i}/CPU:0" for i in range(k)]}
        steps, batches, planned = {}, {}, {}
        for place, devices in placements.items():
            for m in a.micro:
                for schedule in a.schedules:
                    run = chain_run(a, addresses, schedule, m, devices)
                    full = [s.device for s in run.stages]
                    batches[place, m] = batch(a, m, full)
                    steps[schedule, m, place] = run.strategy.call
                    if place == "split":  # the schedule's own limit: K x (1 - its planned bubble)
                        planned[schedule, m] = k * (1 - run.strategy.timeline().bubble_fraction)
                    for ablation in a.ablations:
                        steps[f"{schedule}/{ablation}", m, place] = ablated(run, ablation)
                if a.hand:
                    steps["hand", m, place] = hand_step(a, full, m)
        names = sorted({key[:2] for key in steps}, key=lambda v: (v[1], v[0]))
        for (_, m, place), fn in steps.items():
            for _ in range(a.warmup):
                fn(*batches[place, m])
        print(
            f"# {k} workers ({', '.join(addresses)}) on cores {cores}, one thread each; built and warmed up in "
            f"{time.time() - started:.0f} s",
            flush=True,
        )
        pids = [os.getpid(), *worker_pids]
        times = {key: [] for key in steps}
        t0, r = time.time(), 0
        while r < a.repeats or (
            min(len(quiet_pairs(a, times[n, m, "one"], times[n, m, "split"])) for n, m in names) < a.min_quiet
            and time.time() - t0 < 60 * a.max_minutes
        ):
            for i, (name, m) in enumerate(names):
                for place in ("one", "split") if (r + i) % 2 == 0 else ("split", "one"):
                    times[name, m, place].append(timed(steps[name, m, place], *batches[place, m], a.steps, pids))
            r += 1
            print(
                f"# repeat {r} at {time.time() - started:.0f} s, load {open('/proc/loadavg').read().split()[0]}",
                flush=True,
            )
    rows = []
    for name, m in names:
        one, split = times[name, m, "one"], times[name, m, "split"]
        ideal = k * m / (m + k - 1)
        quiet = quiet_pairs(a, one, split)
        rows.append(
            dict(
                step=name,
                M=m,
                ideal=ideal,
                planned=planned.get((name, m)),
                speedup=statistics.median(o[0] / s[0] for o, s in zip(one, split)),
                quiet=len(quiet),
                quiet_speedup=statistics.median(quiet) if quiet else None,
                one_s=statistics.median(t[0] for t in one),
                split_s=statistics.median(t[0] for t in split),
                foreign=statistics.median(t[1] for t in one + split),
            )
        )
    load = " ".join(open("/proc/loadavg").read().split()[:3])
    print(
        f"\n{kernel_name()}; K={k}, {a.depth}x{a.width} tanh per stage (+{a.first_extra} on the first), microbatch {a.micro_size}, {r} repeats x {a.steps} steps, "
        f"{time.time() - started:.0f} s; load average at the end {load}"
    )
    print(
        f"{'step':12s} {'M':>3s} {'one s':>8s} {'split s':>8s} {'speedup':>8s} {'ideal':>6s} {'effic.':>6s} "
        f"{'foreign':>7s} {'quiet':>5s} {'speedup':>8s} {'effic.':>6s} {'plan':>6s}"
    )
    for row in rows:
        q = (
            f"{row['quiet_speedup']:8.2f} {row['quiet_speedup'] / row['ideal']:6.2f}"
            if row["quiet"]
            else f"{'-':>8s} {'-':>6s}"
        )
        print(
            f"{row['step']:12s} {row['M']:3d} {row['one_s']:8.4f} {row['split_s']:8.4f} {row['speedup']:8.2f} "
            f"{row['ideal']:6.2f} {row['speedup'] / row['ideal']:6.2f} {row['foreign']:7.2f} {row['quiet']:5d} {q} "
            + (f"{row['planned']:6.2f}" if row["planned"] else f"{'-':>6s}")
        )
    if a.markdown:
        print(
            "\n| step | M | ideal | speed-up (all pairs) | efficiency | quiet pairs | speed-up (quiet) | efficiency (quiet) |"
        )
        print("|---|---|---|---|---|---|---|---|")
        for row in rows:
            qs = row["quiet_speedup"]
            print(
                f"| {row['step']} | {row['M']} | {row['ideal']:.2f} | {row['speedup']:.2f} | "
                f"{row['speedup'] / row['ideal']:.2f} | {row['quiet']} | {qs:.2f} | {qs / row['ideal']:.2f} |"
                if qs
                else f"| {row['step']} | {row['M']} | {row['ideal']:.2f} | {row['speedup']:.2f} | "
                f"{row['speedup'] / row['ideal']:.2f} | 0 | - | - |"
            )
    versus = against(a, times) if a.against else []
    if versus:
        print(
            f"\nsplit placement, paired ratio time({a.against}) / time(schedule), median over repeats (>1: faster "
            f"than {a.against})"
        )
        print(f"{'schedule':12s} {'M':>3s} {'pairs':>5s} {'ratio':>7s} {'quiet':>5s} {'ratio':>7s}")
        for v in versus:
            q = f"{v['quiet_ratio']:7.3f}" if v["quiet"] else f"{'-':>7s}"
            print(f"{v['step']:12s} {v['M']:3d} {v['pairs']:5d} {v['ratio']:7.3f} {v['quiet']:5d} {q}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(dict(args=vars(a), load=load, rows=rows, versus=versus), f, indent=1)
    sys.stdout.flush()
    os._exit(0)  # the workers are gone: skip the runtime's teardown RPCs (they only log "Socket closed")


if __name__ == "__main__":
    main()
