"""Language-model training speed: tokens per second of a keras_hub GPT2CausalLM trained by chain, against
keras_hub's own `model.fit` on one device.

    python scripts/bench_lm.py --repeats 9 --markdown   # every case; --markdown adds rows for docs/benchmarks.md
    python scripts/bench_lm.py --quick                  # a smoke test: a tiny model, one repeat of one call each
    python scripts/bench_lm.py --cases keras chain1 --processes 4   # one stage against Keras' fit, 4 processes pooled
    python scripts/bench_lm.py --cases w1 chain2w-eager --every-send  # also against a release after every send

Not a test: it prints a table of tokens/s (tokens = batch x seq_len per step) and ratios.

The model: `keras_hub.models.GPT2CausalLM` from a small config (random weights, no download, no dropout:
`--vocab`, `--seq`, `--hidden`, `--layers`, `--heads`, intermediate size 4 x hidden), learning the next
token at every position: logits (batch, seq, vocab) against integer targets (batch, seq), the mean
cross-entropy over every position. The data: random ids in a token file (`data=tokens`: windows of seq + 1
ids, the inputs and the targets one token on), batches of `--batch`. Adam at lr 1e-3 everywhere, 8 steps
per call everywhere (Keras' `steps_per_execution`, the trainer's default `trainer.steps_per_call`).

Cases of the first process (one process, 4 logical CPU devices, which share one thread pool over the
machine's cores):

- `keras`: keras_hub's own `GPT2CausalLM.fit(steps_per_execution=8)` on /CPU:0, as a user runs it without a
  preprocessor: `{"token_ids", "padding_mask"}` (the mask all ones) and the targets, Keras' Adam, its
  `SparseCategoricalCrossentropy(from_logits=True)`, no metrics (the trainer computes none while training),
  `jit_compile=False` (Keras' own choice on a CPU), fed the trainer's own stream (the same batches);
- `chain1`: `Run.fit` of the same model on one stage (the model called on token ids of length `--seq`, its
  padding mask all ones inside: the trainer's `data=tokens` stream gives one tensor), the trainer's default
  Adam (TensorFlow's fused kernel, `optim.fused=true`); `chain1k`: the same with Keras' own Adam update
  (`optim.fused=false`);
- `chain2`, `chain4`: the model cut into 2 and 4 stages between its transformer blocks (1F1B, M=`--microbatches`,
  8 by default; `placement.balance=even`), one logical CPU device per stage. They share one thread pool: the pipeline's overhead
  (microbatches, copies, the schedule's order), never overlap.

Before timing, the keras model and `chain1k` take two steps on the same two batches from the same initial
weights: their losses must agree (1e-5 on the first step, 1e-4 on the second), else the script stops.

Cases of the second process (bench_pipeline.py's method: real overlap on a CPU): two `python -m chain.worker`
processes on loopback, each pinned to one core with one intra-op and one inter-op thread, and this script's
second process their client, feeding the batches. The client (every thread of it) is pinned, for each timed block,
to the core of the worker that worked least in the block before (`client_on`): in `w1` the free second core, in
the cut cases the lighter stage's. On two cores the client's work (the batches, the calls, the host releases,
about 13 ms a step in a cut case) comes out of a worker's core, best the one with slack. (While every send of the
bottleneck waited for a release, its own core had served better: docs/benchmarks.md.) A host with cores to spare
gives the client its own.

- `w1`: the same model on one stage on worker 0, the same M microbatches (their gradients summed): the
  baseline. (bench_pipeline.py's baseline keeps the cut, both stages on worker 0; here chain refuses it: the
  keras_hub tied embedding, `token_embedding(x, reverse=True)`, on two stages of one device is refused as "a
  weight shared by two stages".)
- `chain2w`: 2 stages, 1F1B, stage k on worker k; its speed-up is time(w1) / time(chain2w);
- `chain2w-eager`: `chain2w` with `pipeline.schedule=eager1f1b` (stage 0's forwards run a backward earlier);
- `chain2w-zbv`: 4 stages in a V (`pipeline.schedule=zbv`), stages k and 3-k on worker k;
- `w1-busy`: `w1` while the second core is busy with the same model's training (keras_hub's fit, one thread,
  in a process of its own pinned to that core, stopped between these blocks): how much two busy cores of this
  machine slow each other (a shared cache and memory bus; on a VM perhaps one physical core's two threads).
  The cut cases run both cores at once, `w1` one: the speed-ups are also held to the ideal slowed by that
  much (`of ideal, busy`).

The cut cases on workers split by `placement.balance=params`: GPT2CausalLM's 10 layers are 4 of embeddings (2 with
weights), 4 transformer blocks, a layer norm and the tied read-out; `even` (the default) cuts [5, 5], the embeddings
and one block against three blocks and the read-out. After the timing, fresh runs of each cut case trace 4 steps
(`trainer.profile`) and their timelines give each stage's time (its forwards' and backwards' ms per step): one run
with the client on each core, each stage's time taken from the run whose client left its worker's core alone (an
action lasts as long as its core took, the client's slices included). The ideal it is held to is (the devices'
summed stage times) / (the busiest device's) x (1 - the schedule's planned bubble with unit-time actions): for
1F1B, M/(M+S-1), 2M/(M+1) = 1.78 at M=8 when the stages are balanced.

Four stages on four single-core workers need four cores: on a 2-core machine they would share cores and
measure nothing; not run.

Timing (bench_overhead.py's and bench_pipeline.py's method): every block first makes one untimed call
(8 steps), then is timed from that call's end to the last call's end (`--calls` calls); each repeat times
one block of every case of the process, in an order rotated by one each repeat; a ratio is the median of
the per-repeat (paired) ratios. Each block records how much CPU other processes took meanwhile (in cores:
the machine's busy time less this process's, and its workers'); a pair is quiet when both blocks' other
processes stayed below `--quiet` cores. On a shared machine, trust the quiet columns.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

from bench_pipeline import cpu_ticks, process_ms  # noqa: E402

LOCAL = ["keras", "chain1", "chain1k", "chain2", "chain4"]  # the first process's cases
WORKER_CUTS = ["chain2w", "chain2w-eager", "chain2w-zbv"]  # the cut cases on workers, held to w1
WORKERS = ["w1", *WORKER_CUTS, "w1-busy"]  # the second process's cases
# case -> (stages, schedule): chain1 and chain1k take the whole batch at once; w1 sums the same microbatches on one stage
LAYOUT = {
    "chain1": (1, None),
    "chain1k": (1, None),
    "chain2": (2, "1f1b"),
    "chain4": (4, "1f1b"),
    "w1": (1, "1f1b"),
    "chain2w": (2, "1f1b"),
    "chain2w-eager": (2, "eager1f1b"),
    "chain2w-zbv": (4, "zbv"),
}
PER_CALL = 8  # Keras' steps_per_execution = the trainer's default trainer.steps_per_call
LR = 1e-3


def token_file(a, path: str) -> None:
    """Random ids below `--vocab`, enough for every window the run reads (the stream wraps around after)."""
    import numpy as np

    np.random.default_rng(0).integers(0, a.vocab, 64 * a.batch * (a.seq + 1)).astype("uint16").tofile(path)


def settings(a, path: str, case: str, addresses: list[str] | None = None, extra: tuple[str, ...] = ()):
    """The trainer's config of `case` on the token file at `path` (`extra`: overrides added last)."""
    import chain

    stages, schedule = LAYOUT[case]
    out = [
        "mode=e2e",
        f"+stages={stages}",
        "data=tokens",
        f"data.path={path}",
        f"data.seq_len={a.seq}",
        f"data.vocab={a.vocab}",
        f"data.batch_size={a.batch}",
        "data.val_fraction=0",
        "optim=adam",
        f"optim.lr={LR}",
        f"trainer.steps_per_call={PER_CALL}",
        "trainer.progress=false",
        "trainer.log_every=1000000",
        "trainer.steps=1000000",
        "checkpoint.export=false",
    ]
    if schedule:
        out += [f"pipeline.schedule={schedule}", f"pipeline.microbatches={a.microbatches}"]
    if case == "chain1k":
        out += ["optim.fused=false"]
    if addresses:
        workers = ["/task:0/CPU:0", "/task:1/CPU:0"][:stages]
        if schedule == "zbv":  # the V: worker k holds stages k and 3-k
            workers = workers + workers[::-1]
        if stages > 1:  # whole blocks per stage: the even split's 10 layers are the embedding and 1 block | 3
            out += ["placement.balance=params"]
        out += [
            f"cluster.workers=[{','.join(addresses)}]",
            f"placement.devices=[{','.join(workers)}]",
            "cluster.lost_after_s=120",
        ]  # a shared machine: a busy worker may answer late
    return chain.compose([*out, *a.set, *extra])


def gpt2(a):
    """(GPT2CausalLM as keras_hub ships it, the same model called on token ids of length --seq with its padding
    mask all ones), the same initial weights every call."""
    import keras
    import keras_hub

    keras.utils.set_random_seed(1)
    backbone = keras_hub.models.GPT2Backbone(
        vocabulary_size=a.vocab,
        num_layers=a.layers,
        num_heads=a.heads,
        hidden_dim=a.hidden,
        intermediate_dim=4 * a.hidden,
        max_sequence_length=a.seq,
        dropout=0.0,
    )
    lm = keras_hub.models.GPT2CausalLM(backbone=backbone, preprocessor=None)
    ids = keras.Input((a.seq,), dtype="int32", name="token_ids")
    return lm, keras.Model(ids, lm({"token_ids": ids, "padding_mask": keras.ops.ones_like(ids)}), name="gpt2")


def clock() -> float:
    return time.perf_counter()


def chain_block(run, workers: list[int] = ()):
    """`block(calls)`: seconds per step of `Run.fit` over `calls` calls of PER_CALL steps after one untimed call.
    `block.work`: then each of `workers`' CPU seconds per step over the same timed calls (its own work, whoever
    waits)."""
    import dataclasses

    def block(calls: int) -> float:
        trainer = dataclasses.replace(run.settings.trainer, steps=run.global_step + (1 + calls) * PER_CALL)
        run.settings = dataclasses.replace(run.settings, trainer=trainer)
        stamps, cpu = [], []

        def stamp(step, out):
            stamps.append(clock())
            if len(stamps) in (PER_CALL, (1 + calls) * PER_CALL):  # the timed calls' start and end
                cpu.append(process_ms(workers))

        run.fit(callback=stamp)
        block.work = [(b - a) / 1000 / (calls * PER_CALL) for a, b in zip(*cpu)]
        return (stamps[-1] - stamps[PER_CALL - 1]) / (calls * PER_CALL)

    block.work = []
    return block


def keras_block(lm, data):
    """`block(calls)`: seconds per step of keras_hub's `lm.fit(steps_per_execution=PER_CALL)` on `data`, timed
    as `chain_block` (Keras calls `on_train_batch_end` once per execution)."""
    import keras

    def block(calls: int) -> float:
        stamps = []
        stamp = keras.callbacks.LambdaCallback(on_train_batch_end=lambda batch, logs: stamps.append(clock()))
        lm.fit(data, epochs=1, steps_per_epoch=(1 + calls) * PER_CALL, verbose=0, callbacks=[stamp], shuffle=False)
        return (stamps[-1] - stamps[0]) / (calls * PER_CALL)

    return block


def compile_keras(lm, per_call: int) -> None:
    import keras

    lm.compile(
        optimizer=keras.optimizers.Adam(learning_rate=LR),
        weighted_metrics=[],
        jit_compile=False,
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        steps_per_execution=per_call,
    )


def as_keras(data):
    """The trainer's batches as keras_hub's GPT2CausalLM takes them without a preprocessor."""
    import tensorflow as tf

    return data.map(lambda x, ys: ({"token_ids": x, "padding_mask": tf.ones_like(x)}, ys["next"]))


def same_math(lm, run) -> None:
    """Two steps of Keras' `train_on_batch` and of `run` (Keras' own Adam) on the same batches from the same
    weights: the same losses, else SystemExit (the comparison would not be of the same training)."""
    import numpy as np

    compile_keras(lm, 1)
    for i, (x, ys) in enumerate(as_keras(run.batches()).take(2)):
        ours = float(run.step(x["token_ids"], {"next": ys})["loss"])
        theirs = float(np.atleast_1d(lm.train_on_batch(x, ys))[0])
        if abs(ours - theirs) > (1e-5 if i == 0 else 1e-4) * abs(theirs):
            raise SystemExit(
                f"keras_hub's fit does not do the trainer's math: step {i + 1} loss {theirs} (Keras), {ours} (chain)"
            )


def measure(cases: dict, a, pids: list[int]) -> dict:
    """case -> [(seconds per step, other processes' cores, this process's cores, each worker's CPU seconds per
    step (`chain_block`'s `work`; none in this process's own cases), the core this process was pinned to
    (`client_on`'s; else None)), ...] over `--repeats` rounds, each case once a round, in an order rotated by
    one each round (after one untimed block each). This process is the workers' client: on two single-core
    workers its CPU comes out of their cores."""
    names = list(cases)
    for name in names:  # trace, allocate, warm the caches
        cases[name](1)
    times = {name: [] for name in names}
    started = time.time()
    for r in range(a.repeats):
        shift = r % len(names)
        for name in names[shift:] + names[:shift]:
            b0, o0 = cpu_ticks(pids)
            c0, t0 = sum(os.times()[:2]), time.perf_counter()
            seconds = cases[name](a.calls)
            wall = time.perf_counter() - t0
            b1, o1 = cpu_ticks(pids)
            client = (sum(os.times()[:2]) - c0) / wall
            other = max(0, (b1 - b0) - (o1 - o0)) / os.sysconf("SC_CLK_TCK") / wall
            times[name].append(
                (seconds, other, client, getattr(cases[name], "work", []), getattr(cases[name], "core", None))
            )
        print(
            f"# repeat {r + 1} at {time.time() - started:.0f} s, load {open('/proc/loadavg').read().split()[0]}",
            file=sys.stderr,
            flush=True,
        )
    return times


def local_phase(a, path: str) -> dict:
    """The first process's cases (module docstring)."""
    import chain

    chain.setup(settings(a, path, "chain4"))  # 4 logical CPU devices, before any tensor exists
    import tensorflow as tf

    wanted = [c for c in LOCAL if c in a.cases]
    cases, runs = {}, {}
    for case in wanted:
        if case != "keras":
            runs[case] = chain.build(settings(a, path, case), model=gpt2(a)[1])
            cases[case] = chain_block(runs[case])
    if "keras" in wanted:
        with tf.device("/CPU:0"):
            lm = gpt2(a)[0]
            if "chain1k" in runs:
                same_math(lm, runs["chain1k"])
            compile_keras(lm, PER_CALL)
            source = next(iter(runs.values())) if runs else chain.build(settings(a, path, "chain1"), model=gpt2(a)[1])
            cases = {"keras": keras_block(lm, as_keras(source.batches())), **cases}
    return measure(cases, a, [os.getpid()])


def workers_phase(a, path: str) -> dict:
    """The second process's cases: 2 single-core workers, this process their client (module docstring)."""
    import chain
    from chain.worker import LocalCluster

    cores = [i % os.cpu_count() for i in range(2)]
    with LocalCluster(2, cpus=cores, threads=1, profile=True) as cluster, neighbour(a, cores[1]) as busy:
        configs = {case: settings(a, path, case, cluster.addresses) for case in ["w1", *WORKER_CUTS] if case in a.cases}
        chain.setup(*configs.values())  # connects to the workers, before any tensor exists
        cases = {
            case: client_on(chain_block(chain.build(cfg, model=gpt2(a)[1]), cluster.pids), cores)
            for case, cfg in configs.items()
        }
        for case in [c for c in WORKER_CUTS if c in configs and a.every_send]:
            cases[f"{case}/every-send"] = client_on(
                every_send(lambda cfg=configs[case]: chain_block(chain.build(cfg, model=gpt2(a)[1]), cluster.pids)),
                cores,
            )
        if busy:
            cases["w1-busy"] = beside(busy, cases["w1"])
        times = measure(cases, a, [os.getpid(), *cluster.pids, *([busy.pid] if busy else [])])
        print(json.dumps(dict(times=times, ideals={})), flush=True)  # kept should a traced run fail
        ideals = {case: traced(a, path, case, cluster, cores) for case in configs if case != "w1"}
        return dict(times=times, ideals=ideals)  # the workers stop as the block ends


def every_send(make):
    """`make()`'s block built and run with a host release after every sending action (`ablations.EVERY_SEND`: the
    rule before `chain.pipeline.play.released`), for the `--every-send` comparison."""
    import ablations

    with ablations.ablated(ablations.EVERY_SEND):
        block = make()

    def run(calls: int) -> float:
        with ablations.ablated(ablations.EVERY_SEND):
            seconds = block(calls)
        run.work = block.work
        return seconds

    run.work = []
    return run


def pin(cores: set[int]) -> None:
    """Every thread of this process on `cores` (`os.sched_setaffinity(0, ...)` moves the calling thread only)."""
    for tid in os.listdir("/proc/self/task"):
        with contextlib.suppress(OSError):  # a thread that ended meanwhile
            os.sched_setaffinity(int(tid), cores)


@contextlib.contextmanager
def pinned(core: int | None):
    """This process on `core` while the context is open (None: where the OS puts it), then back on the cores it
    had."""
    had = os.sched_getaffinity(0)
    if core is not None:
        pin({core})
    try:
        yield
    finally:
        pin(had)


def client_on(block, cores: list[int]):
    """`block` run with this process (the workers' client) pinned to the core of the worker that worked least in
    the block's call before (`block.work`, each worker's CPU per step; the first call unpinned): `w1`'s free core,
    a cut case's lighter stage's (module docstring). `run.core`: the core of the last call (None before any)."""

    def run(calls: int) -> float:
        work = block.work
        run.core = cores[work.index(min(work))] if work else None
        with pinned(run.core):
            seconds = block(calls)
        run.work = block.work
        return seconds

    run.work, run.core = [], None
    return run


@contextlib.contextmanager
def neighbour(a, core: int):
    """The `w1-busy` case's load (module docstring), or None when the case is not asked for: keras_hub's fit of
    the same model on one thread in a process pinned to `core`, ready (traced) and stopped (SIGSTOP); killed
    as the block ends."""
    if "w1-busy" not in a.cases:
        yield None
        return
    args = [sys.executable, __file__, "--phase", "neighbour", *model_args(a)]
    p = subprocess.Popen(args, stdout=subprocess.PIPE, text=True, preexec_fn=lambda: os.sched_setaffinity(0, {core}))
    try:
        if p.stdout.readline().strip() != "ready":
            raise SystemExit(f"the w1-busy case's load did not start (exit {p.wait()})")
        p.send_signal(signal.SIGSTOP)
        yield p
    finally:
        p.kill()
        p.wait()


def neighbour_phase(a) -> None:
    """The `w1-busy` case's load: trains a microbatch at a time until killed (`neighbour`)."""
    import numpy as np
    import tensorflow as tf

    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    lm = gpt2(a)[0]
    compile_keras(lm, PER_CALL)
    ids = np.random.default_rng(1).integers(0, a.vocab, (a.batch // a.microbatches, a.seq))
    data = tf.data.Dataset.from_tensors(({"token_ids": ids, "padding_mask": np.ones_like(ids)}, ids)).repeat()
    lm.fit(data, steps_per_epoch=2 * PER_CALL, verbose=0)
    print("ready", flush=True)
    lm.fit(data, epochs=10**9, steps_per_epoch=PER_CALL, verbose=0)


def beside(busy: subprocess.Popen, block):
    """`block` timed while `busy` runs (SIGCONT, a second to settle, the block, SIGSTOP)."""

    def run(calls: int) -> float:
        busy.send_signal(signal.SIGCONT)
        try:
            time.sleep(1.0)
            seconds = block(calls)
        finally:
            busy.send_signal(signal.SIGSTOP)
        run.work = block.work
        return seconds

    run.work = []
    return run


def traced(a, path: str, case: str, cluster, cores: list[int]) -> dict | None:
    """`ideal` of `case`, or None (said on stderr) when a traced run fails: the timing is kept either way. The
    client's threads share a worker's core (module docstring), and a stage's actions in a trace last as long as
    the core took, the client's slices included: `case` is traced once with the client on each core, and each
    device's stage times come from the run in which the client sat on another core than its worker's."""
    from chain.training.profile import worker_task

    try:
        runs = {}
        for core in cores:
            with pinned(core):
                runs[core] = stage_times(a, path, case, cluster, f"client-on-core-{core}")
    except Exception as e:  # a benchmark's last part: report it and keep the figures
        print(f"# {case}: the traced run failed: {e}", file=sys.stderr, flush=True)
        return None
    if not all(runs.values()):
        print(f"# {case}: a traced run measured no complete step", file=sys.stderr, flush=True)
        return None
    first = runs[cores[0]]
    stage_ms = []
    for k, p in enumerate(first["per_stage"]):
        other = next(c for c in cores if c != cores[worker_task(p["device"])])  # one the client left to its worker
        stage_ms.append(runs[other]["per_stage"][k]["ms"])
    return ideal(stage_ms, [p["device"] for p in first["per_stage"]], first["bubble"], first["split"])


def stage_times(a, path: str, case: str, cluster, label: str) -> dict | None:
    """Each stage's device and time (its forwards' and backwards' ms per step in the timeline, `trainer.profile`,
    docs/measuring.md) in a fresh run of `case` traced after the timing, the planned bubble (unit-time actions)
    and the split; None when the trace measured no complete step. `--keep DIR` keeps its run directory in
    DIR/CASE/LABEL."""
    import chain

    steps = 10
    with tempfile.TemporaryDirectory() as tmp:
        cfg = settings(
            a,
            path,
            case,
            cluster.addresses,
            [cluster.profile_option, "trainer.steps_per_call=1", f"trainer.steps={steps}", "trainer.profile=[5,10]"],
        )
        run = chain.build(cfg, model=gpt2(a)[1], run_dir=tmp)
        summary = run.fit()
        with open(os.path.join(tmp, "timeline.json")) as f:
            per_stage = json.load(f)["per_stage"]
        if a.keep:  # the traced run's directory (timeline.json, the trace), to read its idle time
            shutil.copytree(tmp, os.path.join(a.keep, case, label), dirs_exist_ok=True)
    if not per_stage:
        return None
    return dict(
        per_stage=[dict(device=p["device"], ms=p["forward_ms"] + p["backward_ms"]) for p in per_stage],
        bubble=summary["bubble_fraction"],
        split=[len(s.model.layers) - len(s.model.inputs) for s in run.stages],
    )


def ideal(stage_ms: list[float], devices: list[str], bubble: float, split: list[int]) -> dict:
    """The ideal speed-up over one worker of a schedule on its split: (the devices' summed stage times) / (the
    busiest device's) x (1 - the schedule's planned bubble with unit-time actions; 1F1B: M/(M+S-1); balanced
    stages on 2 devices: 1F1B 2M/(M+1))."""
    busy = {}
    for device, ms in zip(devices, stage_ms):
        busy[device] = busy.get(device, 0.0) + ms
    return dict(
        ideal=sum(busy.values()) / max(busy.values()) * (1 - bubble),
        balanced=len(busy) * (1 - bubble),
        stage_ms=stage_ms,
        bubble=bubble,
        split=split,
    )


def phase(a, name: str, path: str) -> dict:
    """Run one phase in a process of its own (its own devices: logical CPUs, or a connection to workers)."""
    args = [
        sys.executable,
        os.path.abspath(__file__),
        "--phase",
        name,
        "--data",
        path,
        "--cases",
        *a.cases,
        "--repeats",
        str(a.repeats),
        "--calls",
        str(a.calls),
        *model_args(a),
        *(["--set", *a.set] if a.set else []),
        *(["--every-send"] if a.every_send else []),
        *(["--keep", os.path.abspath(a.keep)] if a.keep else []),
    ]
    r = subprocess.run(args, stdout=subprocess.PIPE, text=True)
    if r.returncode != 0:
        raise SystemExit(f"the {name} phase failed (exit {r.returncode})")
    return json.loads(r.stdout.strip().splitlines()[-1])


def model_args(a) -> list[str]:
    """The model's and the batch's options, for another process of this script."""
    names = ["vocab", "seq", "hidden", "layers", "heads", "batch", "microbatches"]
    return [x for name in names for x in (f"--{name}", str(getattr(a, name)))]


def ratios(times: dict, case: str, anchor: str, quiet: float) -> tuple[float, int, float | None]:
    """(median paired ratio time(anchor) / time(case), quiet pairs, their median ratio or None)."""
    pairs = list(zip(times[anchor], times[case]))
    quiet_ratios = [b[0] / t[0] for b, t in pairs if max(b[1], t[1]) < quiet]
    return (
        statistics.median(b[0] / t[0] for b, t in pairs),
        len(quiet_ratios),
        statistics.median(quiet_ratios) if quiet_ratios else None,
    )


WHAT = {
    "keras": "keras_hub `GPT2CausalLM.fit`, one device, Keras' Adam",
    "chain1": "chain, 1 stage, fused Adam (default)",
    "chain1k": "chain, 1 stage, Keras' Adam (`optim.fused=false`)",
    "chain2": "chain, 2 stages, 1F1B, logical CPUs (overhead, no overlap)",
    "chain4": "chain, 4 stages, 1F1B, logical CPUs (overhead, no overlap)",
    "w1": "chain, 1 stage, M microbatches summed, on one single-core worker",
    "chain2w": "chain, 2 stages, 1F1B, one single-core worker each",
    "chain2w-eager": "chain2w with eager 1F1B (`pipeline.schedule=eager1f1b`)",
    "chain2w-zbv": "chain, 4 stages in a V (zbv), stages k and 3-k on single-core worker k",
    "w1-busy": "w1 while the second core trains the same model (Keras' fit, one thread)",
}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--vocab", type=int, default=512)
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--hidden", type=int, default=128)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--microbatches", type=int, default=8, help="M of every cut case and of w1")
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--calls", type=int, default=2, help="timed calls of 8 steps per block")
    p.add_argument("--cases", nargs="+", default=LOCAL + WORKERS, choices=LOCAL + WORKERS)
    p.add_argument(
        "--processes",
        type=int,
        default=1,
        help="processes of the one-process cases, their repeats pooled (a process's keras/chain1 ratio moves by about 0.1)",
    )
    p.add_argument(
        "--set",
        nargs="+",
        default=[],
        metavar="OVERRIDE",
        help="Hydra overrides added to every chain case (e.g. trainer.jit_compile=true); keras' case is unchanged",
    )
    p.add_argument(
        "--every-send",
        action="store_true",
        help="also time each cut case with a host release after every sending action (the rule before "
        "chain.pipeline.play.released), paired",
    )
    p.add_argument("--quiet", type=float, default=0.2, help="other processes' CPU (cores) below which a pair is quiet")
    p.add_argument("--quick", action="store_true", help="a smoke test: a tiny model, one repeat of one call per case")
    p.add_argument(
        "--keep",
        metavar="DIR",
        help="keep each traced run's directory (its timeline.json) in DIR/CASE/client-on-core-N",
    )
    p.add_argument("--markdown", action="store_true", help="also print rows for docs/benchmarks.md")
    p.add_argument("--phase", choices=["local", "workers", "neighbour"], help=argparse.SUPPRESS)  # one process's cases
    p.add_argument("--data", help=argparse.SUPPRESS)  # the token file, given to a phase
    a = p.parse_args()
    if a.quick:
        a.vocab, a.seq, a.hidden, a.layers, a.heads, a.batch, a.repeats, a.calls = 64, 16, 16, 2, 2, 8, 1, 1
    if a.phase == "neighbour":
        neighbour_phase(a)
    if a.phase:
        out = dict(times=local_phase(a, a.data), ideals={}) if a.phase == "local" else workers_phase(a, a.data)
        print(json.dumps(out), flush=True)
        os._exit(0)  # the workers are gone: skip the runtime's teardown RPCs (as bench_pipeline.py does)
    on_workers = "w1" in a.cases and any(c in a.cases for c in WORKERS[1:])
    if on_workers and os.cpu_count() < 2:
        raise SystemExit("chain2w needs 2 cores (one per worker)")
    started = time.time()
    load = " ".join(open("/proc/loadavg").read().split()[:3])
    times, ideals, by_process = {}, {}, {}
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "tokens.bin")
        token_file(a, path)
        for name in ["local"] * any(c in LOCAL for c in a.cases) * a.processes + ["workers"] * on_workers:
            out = phase(a, name, path)
            for case, pairs in out["times"].items():
                times.setdefault(case, []).extend(pairs)
                by_process.setdefault(case, []).append(pairs)
            ideals.update(out["ideals"])
    tokens = a.batch * a.seq
    end = " ".join(open("/proc/loadavg").read().split()[:3])
    print(
        f"\nGPT2CausalLM vocab {a.vocab}, seq {a.seq}, hidden {a.hidden}, {a.layers} layers, {a.heads} heads; batch "
        f"{a.batch} ({tokens} tokens a step), M={a.microbatches} microbatches (cut cases, w1), Adam, {PER_CALL} steps a call; {a.repeats} repeats x {a.calls} calls"
        f"{f' in each of {a.processes} processes (one-process cases)' if a.processes > 1 else ''}; "
        f"{time.time() - started:.0f} s; load average {load} at the start, {end} at the end"
    )
    print(
        "chain2/chain4 share this process's cores on logical CPU devices: the pipeline's overhead, not overlap. "
        "chain2w: two single-core workers against one (w1). 4 workers need 4 cores: not run."
    )
    print(
        f"ratio: tokens/s over the anchor's, median of paired repeats; quiet: other processes below {a.quiet} "
        "cores during both blocks of a pair"
    )
    print(f"{'case':11s} {'tokens/s':>9s} {'anchor':>7s} {'ratio':>6s} {'quiet':>5s} {'ratio':>6s} {'other':>6s}  what")
    rows = []
    for case in [c for c in LOCAL + WORKERS if c in times]:
        anchor = (
            "w1"
            if case.startswith("chain2w") or case == "w1-busy"
            else "keras"
            if case in LOCAL and case != "keras" and "keras" in times
            else None
        )
        ratio, quiet, quiet_ratio = ratios(times, case, anchor, a.quiet) if anchor else (None, 0, None)
        row = dict(
            case=case,
            tokens_s=tokens / statistics.median(t[0] for t in times[case]),
            anchor=anchor,
            ratio=ratio,
            quiet=quiet,
            quiet_ratio=quiet_ratio,
            other=statistics.median(t[1] for t in times[case]),
        )
        rows.append(row)
        print(
            f"{case:11s} {row['tokens_s']:9.0f} {anchor or '-':>7s} "
            + (f"{ratio:6.3f}" if ratio else f"{'-':>6s}")
            + f" {quiet:5d} "
            + (f"{quiet_ratio:6.3f}" if quiet_ratio else f"{'-':>6s}")
            + f" {row['other']:6.2f}  {WHAT[case]}"
        )
    if a.markdown:  # one column per case
        print("\n| | " + " | ".join(f"`{row['case']}`" for row in rows) + " |")
        print("|---|" + "---|" * len(rows))
        print("| tokens/s | " + " | ".join(f"{row['tokens_s']:.0f}" for row in rows) + " |")
        print(
            f"| ratio, all {a.repeats * a.processes} pairs | "
            + " | ".join(f"{row['ratio']:.3f} (`{row['anchor']}`)" if row["ratio"] else "-" for row in rows)
            + " |"
        )
        print(
            "| ratio, quiet pairs (how many) | "
            + " | ".join(
                f"{row['quiet_ratio']:.3f} ({row['quiet']})" if row["quiet_ratio"] else f"- ({row['quiet']})"
                for row in rows
            )
            + " |"
        )
        print("| other processes, cores | " + " | ".join(f"{row['other']:.2f}" for row in rows) + " |")
    if a.processes > 1:
        per_process(by_process, a)
    for case in [c for c in WORKER_CUTS if c in times]:
        speed_ups(case, times, ideals.get(case), a)
    for case in [c for c in WORKER_CUTS if f"{c}/every-send" in times]:
        against_every_send(case, times, a)


def against_every_send(case: str, times: dict, a) -> None:
    """`case`'s step over the same case's with a release after every send (`--every-send`), paired per repeat."""
    pairs = [(t[0] / e[0], max(t[1], e[1]) < a.quiet) for t, e in zip(times[case], times[f"{case}/every-send"])]
    ratios = [r for r, quiet in pairs if quiet]
    print(
        f"\n{case} against {case}/every-send (a release after every send): step ratio per repeat "
        + ", ".join(f"{r:.3f}{'' if quiet else ' (not quiet)'}" for r, quiet in pairs)
        + (
            f"; quiet median {statistics.median(ratios):.3f}, shorter in {sum(r < 1 for r in ratios)} of {len(ratios)}"
            if ratios
            else ""
        )
    )


def per_process(by_process: dict, a) -> None:
    """Each one-process case's ratio to `keras` in each process (the median of its paired repeats): how much
    a process's own ratio moves, beside the pooled median above."""
    if "keras" not in by_process:
        return
    print(f"\nper process, ratio to keras (median of its {a.repeats} pairs):")
    for case in [c for c in LOCAL if c in by_process and c != "keras"]:
        each = [
            statistics.median(b[0] / t[0] for b, t in zip(k, c)) for k, c in zip(by_process["keras"], by_process[case])
        ]
        print(f"{case:11s} " + " ".join(f"{r:.3f}" for r in each) + f"   median {statistics.median(each):.3f}")


def speed_ups(case: str, times: dict, how: dict | None, a) -> None:
    """`case`'s speed-up over `w1` in each repeat (paired), against two ideals of its schedule on its split, both
    (the devices' summed stage work) / (the busiest device's) x (1 - the planned bubble): `ideal`'s, whose stage
    work is the traced run's timeline (None: its traced run measured nothing, the speed-ups alone), and one
    whose work is each worker's CPU seconds per step in the same timed block (the traced timeline's small ops
    are slowed by the trace, which can move the balance; a worker's CPU also holds its share of the crossings).
    With `w1-busy` timed, also against `ideal`'s slowed as much as `w1` is beside a busy core."""
    if how is None:
        how = dict(ideal=float("nan"), bubble=float("nan"))
        print(f"\n{case}: no ideal (its traced run measured no complete step)")
    else:
        stage_ms = " / ".join(f"{v:.3g}" for v in how["stage_ms"])
        print(
            f"\n{case}: split {how['split']} (placement.balance=params), stages {stage_ms} ms per step (forwards "
            f"and backwards in the timeline); planned bubble {how['bubble']:.3f}; ideal {how['ideal']:.3f} "
            f"(balanced stages: {how['balanced']:.3f})"
        )
    print(
        f"{'repeat':>6s} {'w1 s/step':>9s} {'s/step':>7s} {'speed-up':>8s} {'of ideal':>8s} {'quiet':>5s} "
        f"{'client, w1':>10s} {'client':>6s} {'work, w1':>8s} {'work per worker':>15s} {'ideal':>6s} {'of it':>6s}"
        + (f" {'w1 slowed':>9s} {'of ideal, busy':>14s}" if "w1-busy" in times else "")
    )
    ups, of_work, slows, of_busy = [], [], [], []
    busy = times.get("w1-busy", [None] * len(times["w1"]))
    for r, (base, mine, slow) in enumerate(zip(times["w1"], times[case], busy)):
        ups.append(base[0] / mine[0])
        slowed = slow[0] / base[0] if slow else None
        work = mine[3]
        by_work = sum(work) / max(work) * (1 - how["bubble"])
        of_work.append(ups[-1] / by_work)
        if slowed:
            slows.append(slowed)
            of_busy.append(ups[-1] * slowed / how["ideal"])
        quiet = "yes" if max(base[1], mine[1]) < a.quiet else "no"
        print(
            f"{r + 1:6d} {base[0]:9.4f} {mine[0]:7.4f} {ups[-1]:8.3f} {ups[-1] / how['ideal']:8.3f} {quiet:>5s} "
            f"{base[2]:10.3f} {mine[2]:6.3f} {sum(base[3]):8.3f} {' / '.join(f'{w:.3f}' for w in work):>15s} "
            f"{by_work:6.3f} {of_work[-1]:6.3f}" + (f" {slowed:9.3f} {of_busy[-1]:14.3f}" if slowed else "")
        )
    up = statistics.median(ups)
    print(
        f"{'median':>6s} {'':9s} {'':7s} {up:8.3f} {up / how['ideal']:8.3f} {'':>5s} {'':10s} {'':6s} "
        f"{statistics.median(sum(t[3]) for t in times['w1']):8.3f} {'':15s} {'':6s} {statistics.median(of_work):6.3f}"
        + (f" {statistics.median(slows):9.3f} {statistics.median(of_busy):14.3f}" if of_busy else "")
    )
    print(
        "client: this script's process (the workers' client: the batches, the calls) in cores, pinned to the core of "
        f"the worker that worked least (w1: the free second core; {case}: core {times[case][-1][4]}). work: the workers' CPU seconds per step (w1: both "
        "summed); ideal: by that work, with the planned bubble; of it: the speed-up over that ideal. w1 slowed: w1-busy's "
        "time over w1's (the same repeat); of ideal, busy: the speed-up over the timeline's ideal slowed by as much"
    )


if __name__ == "__main__":
    main()
