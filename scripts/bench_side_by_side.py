"""N variants side by side in one process, against N processes one after another and N at once.

    python scripts/bench_side_by_side.py                      # 3 variants, 300 steps, 3 repeats
    python scripts/bench_side_by_side.py --variants 4 --steps 500 --repeats 5 --markdown

Not a test: it prints wall times (medians over repeats, the three ways interleaved in each
repeat) and their ratios. Every way trains the same N models for the same steps on the same
data (`digits`, read once per process):

- `side by side`: one `python -m chain mode=side_by_side +variants=[...]` (one data stream,
  the models on logical devices of one process, `side_by_side.policy` lockstep);
- `sequential`: N `python -m chain +stages=1 <the variant's overrides>`, one after another;
- `concurrent`: the same N processes started at once.

Each process pays TensorFlow's start-up (imports, tracing); the side-by-side run pays it once.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time

COMMON = ["trainer.progress=false", "checkpoint.export=false", "model.depth=2", "data.batch_size=64"]


def variants(n: int) -> list[dict[str, str]]:
    """N variants: learning rates and widths of a small grid."""
    grid = [
        ("0.001", "128"),
        ("0.003", "128"),
        ("0.001", "256"),
        ("0.003", "256"),
        ("0.0003", "128"),
        ("0.0003", "256"),
        ("0.01", "128"),
        ("0.01", "256"),
    ]
    return [{"optim.lr": lr, "model.width": w} for lr, w in grid[:n]]


def command(args: list[str], workdir: str, name: str) -> list[str]:
    return [sys.executable, "-m", "chain", *COMMON, *args, f"hydra.run.dir={os.path.join(workdir, name)}"]


def run_all(cmds: list[list[str]], at_once: bool) -> float:
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    started = time.perf_counter()
    if at_once:
        procs = [subprocess.Popen(c, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE) for c in cmds]
        codes = [(p.wait(), p.stderr.read()) for p in procs]
    else:
        codes = []
        for c in cmds:
            r = subprocess.run(c, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
            codes.append((r.returncode, r.stderr))
    for code, err in codes:
        if code != 0:
            raise SystemExit(f"a run failed: {err.decode()[-500:]}")
    return time.perf_counter() - started


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--variants", type=int, default=3)
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--policy", default="lockstep", choices=["lockstep", "round_robin"])
    p.add_argument("--markdown", action="store_true")
    a = p.parse_args()
    vs = variants(a.variants)
    listed = "[" + ",".join("{" + ", ".join(f"{k}: {v}" for k, v in v.items()) + "}" for v in vs) + "]"
    times: dict[str, list[float]] = {"side by side": [], "sequential": [], "concurrent": []}
    load = open("/proc/loadavg").read().split()[0]
    for r in range(a.repeats):
        with tempfile.TemporaryDirectory() as workdir:
            steps = f"trainer.steps={a.steps}"
            side = [
                command(
                    ["mode=side_by_side", f"+variants={listed}", f"side_by_side.policy={a.policy}", steps],
                    workdir,
                    "side",
                )
            ]
            singles = [
                command(["+stages=1", *[f"{k}={v}" for k, v in v.items()], steps], workdir, f"v{i}")
                for i, v in enumerate(vs)
            ]
            order = [("side by side", side, False), ("sequential", singles, False), ("concurrent", singles, True)]
            for name, cmds, at_once in order[r % 3 :] + order[: r % 3]:  # rotate the order between repeats
                for c in cmds:  # each repeat writes new run directories
                    c[-1] = c[-1] + f"_{name.replace(' ', '_')}"
                times[name].append(run_all(cmds, at_once))
        print(f"# repeat {r + 1}: " + ", ".join(f"{n} {t[-1]:.1f} s" for n, t in times.items()), flush=True)
    med = {n: statistics.median(t) for n, t in times.items()}
    print(
        f"\n{a.variants} variants x {a.steps} steps (digits, 2 Dense layers, batch 64), policy {a.policy}, "
        f"{a.repeats} repeats, medians; load average {load} at the start, "
        f"{open('/proc/loadavg').read().split()[0]} at the end"
    )
    for n, t in med.items():
        print(
            f"  {n:13s} {t:7.1f} s   ({', '.join(f'{x:.1f}' for x in times[n])})   "
            f"side by side is {t / med['side by side']:.2f}x faster"
            if n != "side by side"
            else f"  {n:13s} {t:7.1f} s   ({', '.join(f'{x:.1f}' for x in times[n])})"
        )
    if a.markdown:
        print("\n| way | wall time, s (median) | all repeats, s | time / side by side |")
        print("|---|---|---|---|")
        for n, t in med.items():
            print(f"| {n} | {t:.1f} | {', '.join(f'{x:.1f}' for x in times[n])} | {t / med['side by side']:.2f} |")


if __name__ == "__main__":
    main()
