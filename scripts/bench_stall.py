"""What the stall markers (`trainer.stall_s`, `chain.pipeline.progress`) cost a pipeline step.

    python scripts/bench_stall.py                       # the cases below, 60 blocks each
    python scripts/bench_stall.py --blocks 80 --case "+stages=2 pipeline.microbatches=4"
    python scripts/bench_stall.py --workers --blocks 30 # 2 stages on two single-core workers

Not a test: it prints medians. For each case one run is built (mode=e2e, synthetic data with 128
features, MLP stages of width 256 and depth 2, batch 64, Adam, each stage on its own logical CPU
device) and its step compiled twice over the same stages: without markers and with them. The
steps take turns in blocks of `--steps` calls on one fixed batch (no data stream, no loop around
the step: the markers' cost alone), the order rotating, and each block's wall and CPU time per
step is recorded; a ratio is the median of the paired (per-block) ratios, marked over plain.

`--workers`: each stage on its own single-core worker (`chain.worker.LocalCluster`, cores 0 and 1;
this process is their client, and its CPU time is the client's) and a third step: the markers kept
by the client (each action's marker then a message from its worker to the client), beside the
trainer's, kept by each stage's worker.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
BASE = [
    "mode=e2e",
    "model=mlp",
    "model.width=256",
    "model.depth=2",
    "optim=adam",
    "data=synthetic",
    "data.features=128",
    "data.samples=8192",
    "data.classes=10",
    "data.val_fraction=0",
    "data.batch_size=64",
    "trainer.progress=false",
    "trainer.stall_s=0",
]
CASES = ["+stages=2", "+stages=2 pipeline.microbatches=4", "+stages=4 pipeline.microbatches=8 pipeline.schedule=1f1b"]
WORKER_CASES = ["+stages=2 pipeline.microbatches=8 pipeline.schedule=1f1b"]


def kinds(workers: bool) -> list[str]:
    """The steps `measure` compiles, in its columns' order: plain, (on workers) the markers kept by the
    client, and the trainer's markers."""
    return ["plain", "on the client", "marked"] if workers else ["plain", "marked"]


def measure(case: str, blocks: int, steps: int, workers: list[str] | None = None) -> str:
    """One line: each step's median wall and CPU ms, plain and with markers (on workers: kept by the
    client, and kept by the stages' workers), and the paired ratios over plain."""
    import tensorflow as tf

    import chain
    from chain.pipeline.progress import Progress
    from chain.pipeline.play import e2e_step, host, row_hosts

    words = case.split()
    k = int(next(w for w in words if w.startswith("+stages=")).split("=")[1])
    devices = ",".join(f"/task:{i}/CPU:0" if workers else f"/CPU:{i}" for i in range(k))
    where = [f"cluster.workers=[{','.join(workers)}]"] if workers else []
    run = chain.build(chain.compose(BASE + words + where + [f"placement.devices=[{devices}]"]))
    st, t = run.strategy, run.settings.trainer
    args = st.arguments(*next(iter(run.batches())))
    rows = row_hosts(st.schedule, [st.stages])
    kept_by = {"plain": None, "on the client": [host()] * len(rows), "marked": rows}
    variants = {name: kept_by[name] for name in kinds(bool(workers))}
    fns = {}
    for name, kept in variants.items():
        progress = None if kept is None else Progress(st.schedule, t.grad_accum, host(), kept)
        body = e2e_step(st.stages, st.schedule, st.loss_fn(), st.target, t.grad_accum, t.jit_compile, progress=progress)
        fns[name] = tf.function(body, autograph=False).get_concrete_function(*args)
        for _ in range(5):  # warm: allocations, the executor's caches
            fns[name](*args).numpy()
    wall: dict[str, list[float]] = {name: [] for name in fns}
    cpu: dict[str, list[float]] = {name: [] for name in fns}
    names = list(fns)
    for b in range(blocks):
        for name in names[b % len(names) :] + names[: b % len(names)]:
            w0, c0 = time.perf_counter(), time.process_time()
            for _ in range(steps):
                out = fns[name](*args)
            out.numpy()
            wall[name].append((time.perf_counter() - w0) / steps * 1e3)
            cpu[name].append((time.process_time() - c0) / steps * 1e3)

    def ratio(times, name):
        return statistics.median(m / p for m, p in zip(times[name], times["plain"]))

    med = statistics.median
    actions = sum(len(row) for row in st.schedule.actions) * t.grad_accum
    cells = [f"{med(wall[n]):.3f} / {med(cpu[n]):.3f}" for n in names]
    ratios = [f"{ratio(wall, n):.3f} | {ratio(cpu, n):.3f}" for n in names[1:]]
    return f"| {case} | {actions} | {' | '.join(cells)} | {' | '.join(ratios)} |"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--case", action="append", help="overrides of one case (repeatable); default: three cases")
    p.add_argument("--blocks", type=int, default=60, help="timed blocks of each step")
    p.add_argument("--steps", type=int, default=40, help="steps per block")
    p.add_argument("--workers", action="store_true", help="2 stages on two single-core workers (2 cores)")
    a = p.parse_args()
    import tensorflow as tf

    cases = a.case or (WORKER_CASES if a.workers else CASES)
    n = max(int(next(w for w in c.split() if w.startswith("+stages=")).split("=")[1]) for c in cases)
    if a.workers and n > 2:
        raise SystemExit("--workers runs 2 stages, one per worker (the machine's two cores)")
    if not a.workers:
        tf.config.set_logical_device_configuration(
            tf.config.list_physical_devices("CPU")[0], [tf.config.LogicalDeviceConfiguration()] * n
        )
        tf.config.list_logical_devices()  # start the runtime now: a run's planner would split the CPU its own way
    print(f"start: {subprocess.run(['uptime'], capture_output=True, text=True).stdout.strip()}", flush=True)
    steps = kinds(a.workers)
    print(
        "| case | actions per step | "
        + " | ".join(f"{k} ms/step (wall / CPU)" for k in steps)
        + " | "
        + " | ".join(f"{k}/plain wall | {k}/plain CPU" for k in steps[1:])
        + " |"
    )
    print("|---" * (2 + len(steps) + 2 * (len(steps) - 1)) + "|")
    if a.workers:
        from chain.worker import LocalCluster

        with LocalCluster(2, cpus=[0, 1], threads=1) as cluster:
            for case in cases:
                print(measure(case, a.blocks, a.steps, cluster.addresses), flush=True)
    else:
        for case in cases:
            print(measure(case, a.blocks, a.steps), flush=True)
    print(f"end: {subprocess.run(['uptime'], capture_output=True, text=True).stdout.strip()}")
    if a.workers:
        os._exit(0)  # the workers are gone: skip the runtime's teardown RPCs (as bench_pipeline.py does)


if __name__ == "__main__":
    main()
