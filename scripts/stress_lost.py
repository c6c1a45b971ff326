"""Lose a cluster worker in the middle of a run with `cluster.on_lost=replan` and `wait`, at the issue's
numbers, and check that the run ends where the run that lost nothing ends.

    python scripts/stress_lost.py                  # replan and wait: 40 steps, lost after step 15
    python scripts/stress_lost.py --cases replan --plan-auto   # placement.plan=auto re-plans on the worker left
    python scripts/stress_lost.py --steps 24 --lost-after 9 --every 4

Not a test (tests/test_cluster.py runs a shorter run of each case). Two workers on loopback
(`chain.worker.LocalCluster`), a 2-stage chain (1F1B, 2 microbatches) with one stage on each,
checkpoints every `--every` steps. First the run that loses nothing; then, per case, a run of
`python -m chain` whose worker 1 is killed (SIGKILL) once step `--lost-after` is done:

- `replan`: the run goes on on worker 0 alone (from the last complete checkpoint); it must end at the
  last step with exit 0, its final weights within 1e-5 of the run that lost nothing (both stages on
  one worker: each step's sums are the same, their order may not be);
- `wait`: worker 1 is started again (same address) `--back-after` seconds after the kill; the run goes
  on on both workers and must end bit for bit like the run that lost nothing.

Printed per case: the exit code, the last step, summary.json's event (the line the log says), the
largest relative difference of the final weights, and the seconds from the kill to the end. Exit
status 1 if any check failed.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # stress_kill's reader of checkpoints

from stress_kill import final_values  # noqa: E402

BASE = [
    "+stages=2",
    "model.width=16",
    "data.batch_size=32",
    "trainer.progress=false",
    "checkpoint.export=false",
    "mode=e2e",
    "pipeline.schedule=1f1b",
    "pipeline.microbatches=2",
]
RTOL = {"replan": 1e-5, "wait": 0.0}


def largest_difference(a: dict, b: dict) -> float:
    """The largest difference between the same variable of two runs, relative to the largest magnitude of
    `b`'s (inf: the variables differ in name or type)."""
    import numpy as np

    if a.keys() != b.keys() or any(a[k].dtype != b[k].dtype for k in a):
        return float("inf")
    worst = 0.0
    for k in a:
        if np.issubdtype(a[k].dtype, np.floating):
            worst = max(worst, float(np.max(np.abs(a[k] - b[k])) / max(float(np.max(np.abs(b[k]))), 1e-12)))
        elif not (a[k] == b[k]).all():
            return float("inf")
    return worst


def lose(cluster, args: list[str], run_dir: str, after: int, back_after: float | None) -> tuple[int, float]:
    """`python -m chain ARGS` with worker 1 killed once step `after` is done (and started again
    `back_after` seconds later); its exit code and the seconds from the kill to its end."""
    env = dict(os.environ, CHAIN_TEST_ANNOUNCE="1")  # chain.testhooks: "test-hook: step N done" on stderr
    client = subprocess.Popen(
        [sys.executable, "-m", "chain", *args, f"hydra.run.dir={run_dir}"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        for line in client.stderr:
            if f"test-hook: step {after} done" in line:
                break
        else:
            return client.wait(), 0.0
        cluster.kill(1)
        killed = time.monotonic()
        if back_after is not None:
            time.sleep(back_after)
            cluster.start(1)
        for line in client.stderr:  # the rest, shown where it is not chain's test hooks
            if not line.startswith("test-hook"):
                sys.stderr.write(line)
        return client.wait(), time.monotonic() - killed
    finally:
        client.kill()
        if cluster.procs[1].poll() is not None:
            cluster.start(1)


def stress(a: argparse.Namespace, workdir: str) -> bool:
    """The run that loses nothing, then each case of `a.cases` (see the module), in `workdir`; whether
    every check held. Prints a line per case."""
    from chain.worker import LocalCluster

    args = [*BASE, f"trainer.steps={a.steps}", f"checkpoint.every={a.every}", "cluster.lost_after_s=2"]
    ok = True
    with LocalCluster(2) as cluster:
        straight = os.path.join(workdir, "straight")
        r = subprocess.run(
            [sys.executable, "-m", "chain", *args, cluster.option, f"hydra.run.dir={straight}"],
            capture_output=True,
            text=True,
        )
        if r.returncode != 0:
            print(f"the run that loses nothing failed: exit {r.returncode}: {r.stderr[-2000:]}")
            return False
        reference = final_values(straight)
        for case in a.cases.split(","):
            run_dir = os.path.join(workdir, case)
            more = [f"cluster.on_lost={case}", *(["placement.plan=auto"] if a.plan_auto else [])]
            code, took = lose(
                cluster, [*args, cluster.option, *more], run_dir, a.lost_after, a.back_after if case == "wait" else None
            )
            summary = json.load(open(os.path.join(run_dir, "summary.json"))) if code == 0 else {}
            events = summary.get("lost_workers") or []
            diff = largest_difference(final_values(run_dir), reference) if code == 0 else float("inf")
            close = diff <= RTOL[case] or a.plan_auto  # plan=auto's plan may differ from the reference's
            good = code == 0 and summary.get("steps") == a.steps and len(events) == 1 and close
            ok &= good
            print(
                f"{case}: exit {code}, ended at step {summary.get('steps')}, {took:.1f} s from the kill to the end, "
                f"final weights {'bit for bit' if diff == 0 else f'within {diff:.1e}'} of the run that lost "
                f"nothing ({'ok' if good else 'FAILED'})",
                flush=True,
            )
            for e in events:
                print(f"  lost_workers: {json.dumps(e)}", flush=True)
    return ok


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", default="replan,wait", help="comma-separated: replan, wait")
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--every", type=int, default=5, help="checkpoint.every")
    ap.add_argument("--lost-after", type=int, default=15, help="worker 1 is killed once this step is done")
    ap.add_argument("--back-after", type=float, default=2.0, help="wait: seconds until worker 1 starts again")
    ap.add_argument("--plan-auto", action="store_true", help="the lost runs with placement.plan=auto")
    ap.add_argument("--workdir", default=None, help="kept when given (default: a temporary one, removed)")
    a = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="stress_lost_") as scratch:
        ok = stress(a, a.workdir or scratch)
    print("OK" if ok else "FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
