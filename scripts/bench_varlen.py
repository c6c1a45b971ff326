"""Examples of different lengths: real tokens per second of `model=gpt` on the lines of the Python standard
library's sources, in length buckets and packed, against every batch padded to the longest line.

    python scripts/bench_varlen.py              # the three cases, 2 stages on 2 logical CPU devices
    python scripts/bench_varlen.py --quick      # a smoke test: few steps

Not a test: it prints the lines' lengths (quantiles) and a table. Real tokens are the targets that are not
padding (id 0), counted on the batches each case trains; tokens/s is their count over the timed steps'
time (each case's first pass over its shapes, which traces the step, left out). The cases, all
`data=text data.examples=lines data.seq_len=SEQ`, 2 stages (GPipe, 2 microbatches), one logical CPU device
each (one process: they share a thread pool, so this measures the padding saved, not overlap):

- `padded`: `data.buckets=[L]`, every batch padded to the longest line L (at most SEQ; what one shape costs);
- `buckets`: `data.buckets=auto` (from the lengths: printed);
- `packed`: `data.pack=true`, windows of SEQ filled with several lines.
"""

from __future__ import annotations

import argparse
import glob
import os
import sys
import sysconfig
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))


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
    print(f"{len(n)} lines; length median {q[0]}, 90% {q[1]}, 99% {q[2]}, max {q[3]} (cut to {seq})")
    return int(min(q[3], seq))


def case(name: str, path: str, seq: int, steps: int, extra: list[str]) -> float:
    import chain

    cfg = chain.compose(
        [
            "mode=e2e",
            "model=gpt",
            "data=text",
            f"data.path={path}",
            "data.examples=lines",
            f"data.seq_len={seq}",
            "data.batch_size=16",
            "data.val_fraction=0",
            "model.width=64",
            "model.heads=4",
            "model.depth=2",
            "+stages=2",
            "pipeline.microbatches=2",
            "trainer.progress=false",
            *extra,
        ]
    )
    run = chain.build(cfg)
    it = iter(run.batches())
    batches = [next(it) for _ in range(steps)]
    seen = set()
    for x, ys in batches:  # every shape traced before timing
        shape = tuple(x["token_ids"].shape if isinstance(x, dict) else x.shape)
        if shape not in seen:
            seen.add(shape)
            run.step(x, ys)
    real = sum(int(np.count_nonzero(ys["next"].numpy())) for _, ys in batches)
    start = time.perf_counter()
    for x, ys in batches:
        run.step(x, ys)
    elapsed = time.perf_counter() - start
    print(f"{name:8s} {real / elapsed:10.0f} real tokens/s  ({steps} steps, traces {run.strategy.traces})")
    return real / elapsed


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--files", type=int, default=40)
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--quick", action="store_true")
    a = p.parse_args()
    steps = 6 if a.quick else a.steps
    import chain

    chain.setup(chain.compose(["+stages=2"]))
    with tempfile.TemporaryDirectory() as d:
        path = corpus(d, a.files)
        top = longest(path, a.seq)
        padded = case("padded", path, a.seq, steps, [f"data.buckets=[{top}]"])
        bucketed = case("buckets", path, a.seq, steps, ["data.buckets=auto"])
        packed = case("packed", path, a.seq, steps, ["data.pack=true"])
    print(f"buckets / padded {bucketed / padded:.2f}x; packed / padded {packed / padded:.2f}x")


if __name__ == "__main__":
    main()
