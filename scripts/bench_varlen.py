"""Examples of different lengths: real tokens per second of `model=gpt` on the lines of the Python standard
library's sources, in length buckets and packed, against every batch padded to the longest line; 2 stages on
one process's logical devices, and on two single-core workers.

    python scripts/bench_varlen.py --repeats 3   # both places, every case, 3 repeats
    python scripts/bench_varlen.py --quick       # a smoke test: few steps, one repeat
    python scripts/bench_varlen.py --places local

Not a test: it prints the lines' lengths (quantiles), each repeat's real tokens/s, their medians and the
paired ratios. Real tokens are the targets that are not padding (id 0), counted on the batches each case
trains; tokens/s is their count over the timed steps' time. The cases, all `data=text data.examples=lines
data.seq_len=SEQ` (`--seq`), batches of `--batch`, `model=gpt` (width 64, depth 2) in 2 stages (GPipe, 2
microbatches):

- `padded`: `data.buckets=[L]`, every batch padded to the longest line L (at most SEQ; what one shape costs);
- `buckets`: `data.buckets=auto` (from the lengths: printed);
- `packed`: `data.pack=true`, windows of SEQ filled with several lines.

Places, each a process of its own (its own devices): `local`, one logical CPU device per stage in this
machine's one process (they share one thread pool: the padding saved, not overlap); `workers`, two `python
-m chain.worker` processes on loopback (bench_pipeline.py's and bench_lm.py's method), each pinned to one
core with one intra-op and one inter-op thread, stage k on worker k, the phase's process their client.

Timing: each case draws `--steps` batches of its stream once and steps once on each shape first (the
traces, untimed); then each repeat times every case's steps on those batches, in an order rotated by one
each repeat. A ratio is the median of the per-repeat (paired) ratios of tokens/s, buckets and packed over
padded.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import statistics
import subprocess
import sys
import sysconfig
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

CASES = ("padded", "buckets", "packed")
PLACES = ("local", "workers")


def corpus(folder: str, files: int) -> str:
    """The first `files` modules of the standard library (sorted), their text with NUL bytes left out."""
    paths = sorted(glob.glob(os.path.join(sysconfig.get_paths()["stdlib"], "*.py")))[:files]
    out = os.path.join(folder, "stdlib.txt")
    with open(out, "wb") as f:
        for p in paths:
            f.write(open(p, "rb").read().replace(b"\0", b""))
    return out


def longest(path: str, seq: int) -> int:
    """The longest line (at most `seq`), after printing the lines' lengths."""
    n = np.array([len(line) for line in open(path, "rb").read().split(b"\n") if len(line) >= 1])
    q = np.quantile(n, [0.5, 0.9, 0.99, 1.0]).astype(int)
    print(f"{len(n)} lines; length median {q[0]}, 90% {q[1]}, 99% {q[2]}, max {q[3]} (cut to {seq})", flush=True)
    return int(min(q[3], seq))


def settings(a, case: str, top: int, addresses: list[str] | None = None):
    """The config of `case` on the corpus `a.data`; on `addresses`' workers when given."""
    import chain

    extra = {"padded": [f"data.buckets=[{top}]"], "buckets": ["data.buckets=auto"], "packed": ["data.pack=true"]}
    workers = (
        [f"cluster.workers=[{','.join(addresses)}]", "placement.devices=[/task:0/CPU:0,/task:1/CPU:0]"]
        if addresses
        else []
    )
    return chain.compose(
        [
            "mode=e2e",
            "model=gpt",
            "data=text",
            f"data.path={a.data}",
            "data.examples=lines",
            f"data.seq_len={a.seq}",
            f"data.batch_size={a.batch}",
            "data.val_fraction=0",
            "model.width=64",
            "model.heads=4",
            "model.depth=2",
            "+stages=2",
            "pipeline.microbatches=2",
            "trainer.progress=false",
            "checkpoint.export=false",
            *extra[case],
            *workers,
        ]
    )


def prepared(run, steps: int):
    """`steps` batches of the run's stream, each shape stepped once (traced), and their real tokens."""
    it = iter(run.batches())
    batches = [next(it) for _ in range(steps)]
    seen = set()
    for x, ys in batches:
        shape = tuple(x["token_ids"].shape if isinstance(x, dict) else x.shape)
        if shape not in seen:
            seen.add(shape)
            run.step(x, ys)
    return batches, sum(int(np.count_nonzero(ys["next"].numpy())) for _, ys in batches)


def measure(runs: dict, a) -> dict:
    """case -> real tokens/s of each repeat, the cases in an order rotated by one each repeat."""
    ready = {case: prepared(run, a.steps) for case, run in runs.items()}
    out: dict[str, list[float]] = {case: [] for case in runs}
    names = list(runs)
    for r in range(a.repeats):
        for case in names[r % len(names) :] + names[: r % len(names)]:
            batches, real = ready[case]
            start = time.perf_counter()
            for x, ys in batches:
                runs[case].step(x, ys)
            out[case].append(real / (time.perf_counter() - start))
        print(f"# repeat {r + 1}, load {open('/proc/loadavg').read().split()[0]}", file=sys.stderr, flush=True)
    for case, run in runs.items():
        print(f"# {case}: traces {run.strategy.traces}", file=sys.stderr, flush=True)
    return out


def local_phase(a) -> dict:
    """The cases on 2 logical CPU devices of this process."""
    import chain

    configs = {case: settings(a, case, a.top) for case in CASES}
    chain.setup(*configs.values())
    return measure({case: chain.build(cfg) for case, cfg in configs.items()}, a)


def workers_phase(a) -> dict:
    """The cases on 2 single-core workers, this process their client."""
    import chain
    from chain.worker import LocalCluster

    cores = [i % os.cpu_count() for i in range(2)]
    with LocalCluster(2, cpus=cores, threads=1) as cluster:
        configs = {case: settings(a, case, a.top, cluster.addresses) for case in CASES}
        chain.setup(*configs.values())  # connects to the workers, before any tensor exists
        return measure({case: chain.build(cfg) for case, cfg in configs.items()}, a)


def phase(a, place: str) -> dict:
    """Run one place's cases in a process of its own; case -> tokens/s per repeat."""
    args = [sys.executable, os.path.abspath(__file__), "--phase", place, "--data", a.data, "--top", str(a.top)]
    args += ["--seq", str(a.seq), "--steps", str(a.steps), "--repeats", str(a.repeats), "--batch", str(a.batch)]
    r = subprocess.run(args, stdout=subprocess.PIPE, text=True)
    if r.returncode != 0:
        raise SystemExit(f"the {place} phase failed (exit {r.returncode})")
    return json.loads(r.stdout.strip().splitlines()[-1])


def report(place: str, speeds: dict) -> None:
    """Each case's tokens/s per repeat and median, and its median paired ratio over `padded`."""
    print(f"\n{place}: real tokens/s per repeat, median, paired ratio over padded (median)")
    for case in CASES:
        each = speeds[case]
        ratio = statistics.median(c / p for c, p in zip(each, speeds["padded"]))
        shown = " ".join(f"{s:8.0f}" for s in each)
        print(f"{case:8s} {shown}   median {statistics.median(each):8.0f}   {ratio:5.2f}x")


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--files", type=int, default=40)
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--places", nargs="+", choices=PLACES, default=list(PLACES))
    p.add_argument("--quick", action="store_true")
    p.add_argument("--phase", choices=PLACES, help=argparse.SUPPRESS)  # one place, in a process of its own
    p.add_argument("--data", help=argparse.SUPPRESS)
    p.add_argument("--top", type=int, help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.phase:
        print(json.dumps((local_phase if a.phase == "local" else workers_phase)(a)))
        return
    if a.quick:
        a.steps, a.repeats = 6, 1
    with tempfile.TemporaryDirectory() as d:
        a.data = corpus(d, a.files)
        a.top = longest(a.data, a.seq)
        when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
        print(f"{when}; batches of {a.batch}, {a.steps} steps a case, {a.repeats} repeats")
        for place in a.places:
            report(place, phase(a, place))


if __name__ == "__main__":
    main()
