"""Measured against planned bubble: the chain's e2e step on K single-core cluster workers, profiled
through the trainer (`trainer.profile`), where stages really overlap.

    python scripts/bench_timeline.py                          # GPipe, M=8, K=2: steps 4-8 of 8 traced
    python scripts/bench_timeline.py --schedule 1f1b --micro 4 --repeats 3

Not a test: it prints, per repeat, the planned bubble (unit-time actions) and the measured one
(`timeline.json`: idle time of stages x span, from the traced ops of each worker), the text
grids and the balance advice, and writes the run's report (`report.html`, with the measured
Gantt chart) in its run directory. The workers (`python -m chain.worker --cpus i --threads 1
--profile-port P`) are pinned to one core each with one thread, so each runs one op at a time
like an accelerator with one stream. The model is `bench_pipeline.py`'s: K stages of 4 Dense
layers of width 1024 with tanh, microbatch 128, SGD. Each repeat records how much CPU other
processes took while it trained (cores; on a 2-core machine anything else steals from a worker).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile

from bench_pipeline import foreign_cpu, model_arguments, overrides
from chain.worker import LocalCluster

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    model_arguments(p)
    p.add_argument("--micro", type=int, default=8, help="microbatches M")
    p.add_argument("--schedule", default="gpipe", choices=["gpipe", "1f1b", "sequential", "zb1", "interleaved"])
    p.add_argument("--steps", type=int, default=8, help="steps per run; the last --traced are profiled")
    p.add_argument("--traced", type=int, default=5)
    p.add_argument("--repeats", type=int, default=3, help="runs (each a new run directory)")
    p.add_argument("--out", default="", help="parent of the run directories (default: a temporary one)")
    p.add_argument("--json", default="")
    a = p.parse_args()
    import logging

    import chain

    logging.getLogger("tensorflow").setLevel(logging.ERROR)  # each repeat's checkpoint saver traces anew: no warning
    out = a.out or tempfile.mkdtemp(prefix="bench_timeline_")
    rows = []
    with LocalCluster(a.stages, cpus=[i % os.cpu_count() for i in range(a.stages)], threads=1, profile=True) as cluster:
        devices = [f"/task:{i}/CPU:0" for i in range(a.stages)]
        for r in range(a.repeats):
            run_dir = os.path.join(out, f"run{r}")
            cfg = chain.compose(
                [
                    *overrides(a, cluster.addresses, a.schedule, a.micro, devices),
                    cluster.profile_option,
                    f"trainer.steps={a.steps}",
                    f"trainer.profile=[{a.steps - a.traced + 1},{a.steps}]",
                    "trainer.steps_per_call=1",  # one-step calls: the step that compiles them comes before the window
                    "checkpoint.export=false",
                    "report=true",
                ]
            )
            run = chain.build(cfg, run_dir=run_dir)
            summary = {}
            _, foreign = foreign_cpu(lambda: summary.update(run.fit()), [os.getpid(), *cluster.pids])  # noqa: B023 (called at once)
            with open(os.path.join(run_dir, "timeline.json")) as f:
                measured = json.load(f)
            row = dict(
                run_dir=run_dir,
                planned=summary["bubble_fraction"],
                measured=summary["measured_bubble_fraction"],
                step_ms=measured["step_ms"],
                foreign=foreign,
                load=open("/proc/loadavg").read().split()[0],
                per_stage=[
                    {k: p[k] for k in ("busy_ms", "forward_ms", "backward_ms", "copy_ms", "copy_wait_ms", "update_ms")}
                    for p in measured["per_stage"]
                ],
                advice=summary.get("balance_advice"),
            )
            rows.append(row)
            print(
                f"# repeat {r}: planned {row['planned']:.3f}, measured {row['measured']:.3f}, step {row['step_ms']:.1f} ms, "
                f"foreign CPU {foreign:.2f} cores, load {row['load']}; {run_dir}/report.html",
                flush=True,
            )
    print(
        f"\n{a.schedule}, K={a.stages}, M={a.micro}, {a.depth}x{a.width} tanh per stage, microbatch {a.micro_size}; "
        f"steps {a.steps - a.traced + 1}-{a.steps} of each run traced"
    )
    print(
        f"{'repeat':>6s} {'planned':>8s} {'measured':>8s} {'diff':>6s} {'step ms':>8s} {'foreign':>7s} "
        + " ".join(
            f"{'busy' + str(k):>7s} {'F' + str(k):>6s} {'B' + str(k):>6s} {'wait' + str(k):>6s}"
            for k in range(a.stages)
        )
    )
    for r, row in enumerate(rows):
        print(
            f"{r:6d} {row['planned']:8.3f} {row['measured']:8.3f} {row['measured'] - row['planned']:6.3f} "
            f"{row['step_ms']:8.1f} {row['foreign']:7.2f} "
            + " ".join(
                f"{p['busy_ms']:7.1f} {p['forward_ms']:6.1f} {p['backward_ms']:6.1f} {p['copy_wait_ms']:6.1f}"
                for p in row["per_stage"]
            )
        )
    measured = statistics.median(row["measured"] for row in rows)
    print(
        f"median measured bubble {measured:.3f} against planned {rows[0]['planned']:.3f} "
        f"(difference {measured - rows[0]['planned']:+.3f}); load average {' '.join(open('/proc/loadavg').read().split()[:3])}"
    )
    if a.json:
        with open(a.json, "w") as f:
            json.dump(dict(args=vars(a), rows=rows), f, indent=1)
    sys.stdout.flush()
    os._exit(0)  # the workers are gone: skip the runtime's teardown RPCs


if __name__ == "__main__":
    main()
