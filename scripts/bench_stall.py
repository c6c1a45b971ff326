"""What the stall markers (`trainer.stall_s`, `chain.pipeline.progress`) cost a pipeline step.

    python scripts/bench_stall.py                       # the cases below, 60 blocks each
    python scripts/bench_stall.py --blocks 80 --case "+stages=2 pipeline.microbatches=4"

Not a test: it prints medians. For each case one run is built (mode=e2e, synthetic data with 128
features, MLP stages of width 256 and depth 2, batch 64, Adam, each stage on its own logical CPU
device) and its step compiled twice over the same stages: without markers and with them. The two
take turns in blocks of `--steps` calls on one fixed batch (no data stream, no loop around the
step: the markers' cost alone), the order alternating, and each block's wall and CPU time per
step is recorded; the ratio is the median of the paired (per-block) ratios, marked over plain.
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


def measure(case: str, blocks: int, steps: int) -> str:
    """One line: each step's median wall and CPU ms, without and with markers, and the paired ratios."""
    import tensorflow as tf

    import chain
    from chain.pipeline.progress import Progress
    from chain.pipeline.play import e2e_step, host

    words = case.split()
    k = int(next(w for w in words if w.startswith("+stages=")).split("=")[1])
    devices = ",".join(f"/CPU:{i}" for i in range(k))
    run = chain.build(chain.compose(BASE + words + [f"placement.devices=[{devices}]"]))
    st, t = run.strategy, run.settings.trainer
    args = st.arguments(*next(iter(run.batches())))
    fns = {}
    for name, progress in (("plain", None), ("marked", Progress(st.schedule, t.grad_accum, host()))):
        body = e2e_step(st.stages, st.schedule, st.loss_fn(), st.target, t.grad_accum, t.jit_compile, progress=progress)
        fns[name] = tf.function(body, autograph=False).get_concrete_function(*args)
        for _ in range(5):  # warm: allocations, the executor's caches
            fns[name](*args).numpy()
    wall: dict[str, list[float]] = {name: [] for name in fns}
    cpu: dict[str, list[float]] = {name: [] for name in fns}
    for b in range(blocks):
        for name in ("plain", "marked") if b % 2 else ("marked", "plain"):
            w0, c0 = time.perf_counter(), time.process_time()
            for _ in range(steps):
                out = fns[name](*args)
            out.numpy()
            wall[name].append((time.perf_counter() - w0) / steps * 1e3)
            cpu[name].append((time.process_time() - c0) / steps * 1e3)

    def ratio(times):
        return statistics.median(m / p for m, p in zip(times["marked"], times["plain"]))

    med = statistics.median
    actions = sum(len(row) for row in st.schedule.actions) * t.grad_accum
    return (
        f"| {case} | {actions} | {med(wall['plain']):.3f} / {med(cpu['plain']):.3f} | "
        f"{med(wall['marked']):.3f} / {med(cpu['marked']):.3f} | {ratio(wall):.3f} | {ratio(cpu):.3f} |"
    )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--case", action="append", help="overrides of one case (repeatable); default: three cases")
    p.add_argument("--blocks", type=int, default=60, help="timed blocks of each step")
    p.add_argument("--steps", type=int, default=40, help="steps per block")
    a = p.parse_args()
    import tensorflow as tf

    cases = a.case or CASES
    n = max(int(next(w for w in c.split() if w.startswith("+stages=")).split("=")[1]) for c in cases)
    tf.config.set_logical_device_configuration(
        tf.config.list_physical_devices("CPU")[0], [tf.config.LogicalDeviceConfiguration()] * n
    )
    tf.config.list_logical_devices()  # start the runtime now: a run's planner would split the CPU its own way
    print(f"start: {subprocess.run(['uptime'], capture_output=True, text=True).stdout.strip()}", flush=True)
    print(
        "| case | actions per step | plain ms/step (wall / CPU) | marked ms/step (wall / CPU) | "
        "marked/plain wall | marked/plain CPU |"
    )
    print("|---|---|---|---|---|---|")
    for case in cases:
        print(measure(case, a.blocks, a.steps), flush=True)
    print(f"end: {subprocess.run(['uptime'], capture_output=True, text=True).stdout.strip()}")


if __name__ == "__main__":
    main()
