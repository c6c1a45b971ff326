"""Measured bubble of each schedule on two single-core workers (`trainer.profile`).

`scripts/bench_pipeline.py` times the schedules; this runs the same chain (its model and
`overrides`) once per schedule and M with `trainer.profile` over the last steps, on two workers
pinned to one core each that serve TensorFlow's profiler, and prints the planned and the
measured bubble fraction from each run's summary.json (idle stage time over stages x span), and
what fills the difference (`chain.pipeline.idle`, from its timeline.json): the bubble the schedule
has when replayed with the measured actions' durations, and per device, the ms of a step it
spent busy, waiting for an input, waiting after its inputs were there (overhead: releases,
transfers) and idle after its last action, with the step's head and finish outside the span.

    python scripts/bench_bubble.py --micro 4 8 --schedules 1f1b zb1 interleaved zbv
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from bench_pipeline import SCHEDULES, kernels, model_arguments, overrides  # noqa: E402

from chain.pipeline import idle  # noqa: E402
from chain.records.measured import MeasuredTimeline  # noqa: E402
from chain.records.serial import from_json  # noqa: E402
from chain.worker import LocalCluster  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    model_arguments(p)
    p.add_argument("--micro", type=int, nargs="+", default=[4, 8], help="microbatch counts M")
    p.add_argument("--schedules", nargs="+", default=["1f1b", "zb1", "interleaved", "zbv"], choices=SCHEDULES)
    p.add_argument("--steps", type=int, default=8, help="steps per run; the last half are profiled")
    a = p.parse_args()
    used = kernels(a)
    import chain

    rows = []
    with LocalCluster(a.stages, cpus=[i % os.cpu_count() for i in range(a.stages)], threads=1, profile=True) as cluster:
        devices = [f"/task:{i}/CPU:0" for i in range(a.stages)]
        for m in a.micro:
            for schedule in a.schedules:
                with tempfile.TemporaryDirectory() as run_dir:
                    args = [
                        *overrides(a, cluster.addresses, schedule, m, devices),
                        f"trainer.steps={a.steps}",
                        f"trainer.profile=[{a.steps // 2 + 1},{a.steps}]",
                        "trainer.steps_per_call=1",  # one-step calls: the step that compiles them comes before the window
                        cluster.profile_option,
                        "checkpoint.every=0",
                        "checkpoint.export=false",
                    ]
                    run = chain.build(chain.compose(args), run_dir=run_dir)
                    run.fit()
                    with open(os.path.join(run_dir, "summary.json")) as f:
                        s = json.load(f)
                    with open(os.path.join(run_dir, "timeline.json")) as f:
                        why = idle.explain(from_json(MeasuredTimeline, json.load(f)), run.schedule)
                rows.append((schedule, m, s["bubble_fraction"], s["measured_bubble_fraction"], why))
                print(f"# {schedule} M={m}: planned {rows[-1][2]:.3f} measured {rows[-1][3]}", flush=True)
                if why is not None:
                    print("\n".join(f"#   {line}" for line in idle.render(why).splitlines()), flush=True)
    load = " ".join(open("/proc/loadavg").read().split()[:3])
    print(
        f"\n{used}; K={a.stages}, {a.depth}x{a.width} tanh per stage (+{a.first_extra} on the first), microbatch {a.micro_size}; load average {load}"
    )
    print("| schedule | M | planned bubble | replayed bubble | measured bubble |\n|---|---|---|---|---|")
    for schedule, m, planned, measured, why in rows:
        replayed = "-" if why is None else f"{why.replayed_bubble_fraction:.3f}"
        print(f"| {schedule} | {m} | {planned:.3f} | {replayed} | {'-' if measured is None else f'{measured:.3f}'} |")
    print("\nms per step (medians over the profiled steps); per device: busy / waiting for inputs / overhead / tail")
    print("| schedule | M | head | span | finish | " + " | ".join(f"device {d}" for d in range(a.stages)) + " |")
    print("|---|---|---|---|---|" + "---|" * a.stages)
    for schedule, m, _, _, why in rows:
        if why is not None:
            cells = [
                f"{d.busy_ms:.0f} / {d.input_wait_ms:.1f} / {d.overhead_ms:.1f} / {d.tail_ms:.1f}" for d in why.devices
            ]
            print(
                f"| {schedule} | {m} | {why.head_ms:.1f} | {why.span_ms:.1f} | {why.finish_ms:.1f} | "
                + " | ".join(cells)
                + " |"
            )


if __name__ == "__main__":
    main()
