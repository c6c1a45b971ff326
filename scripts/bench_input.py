"""The input stream against the training step: in-memory data vs the same records streamed from files.

    python scripts/bench_input.py                      # default and large models, 5 repeats
    python scripts/bench_input.py --markdown           # the table for docs/benchmarks.md
    python scripts/bench_input.py --sizes default --repeats 3 --calls 20
    python scripts/bench_input.py --source npz        # the same records in one .npz (or --source csv)
    python scripts/bench_input.py --identity --sizes default   # the stream's file check against a run's steps

Not a test: it prints medians of paired ratios. One process (two logical CPU devices, as every
run on this machine); the data are generated into a temporary directory (TFRecord shards, or with
`--source` the same records in one uncompressed `.npz` or one CSV file), read whole into memory
(`data.stream=false`) by one run and streamed (`data.stream=true`) by the other, so both train on
the very same examples.

(a) the stream alone: examples/second of `Run.batches()` iterated on the host (`next()`, no
    training), for the in-memory and the streamed source;
(b) training: steps/second of `Run.steps(trainer.steps_per_call)` (the fit loop's calls: the
    default 8 steps per call), the in-memory run and the streamed run built side by side.

Every repeat measures each of (a) and (b) for both sources, in a random order, each block
after one untimed call (or batch) of its own; a ratio is streamed over in-memory of one
repeat (paired), and the figure is the median of the repeats' ratios (min and max beside).

`--identity`: what a streamed run's check of its files costs (`chain.data.identity`: every file
stamped with its size, modification time and digest at start, and compared with a checkpoint's on
resume), against the run it guards: the check's time (median of the repeats, the files in the page
cache) over the time of 1000 steps of the streamed run (the median step time of the repeats, each
`--calls` calls of 8 steps).

Sizes: `default` is the default model (mlp width 64, depth 2, 2 stages, mode=local) on
batches of 64 examples of 64 floats (the figure docs/your-data.md quoted); `large` is
scripts/bench_overhead.py's large (width 1024, batch 256) on 128 floats, 10 classes.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
# name -> (model width, batch, floats per example)
SIZES = {"default": (64, 64, 64), "large": (1024, 256, 128)}
SHARDS, PER_SHARD = 8, 2048  # 16384 records per size: several epochs of batches for the stream alone


def write_tfrecord(path: str, x, y) -> None:
    """One TFRecord file of `tf.train.Example` records {x: float32[...], y: int64}, one per row of `x`."""
    import tensorflow as tf

    with tf.io.TFRecordWriter(path) as w:
        for row, label in zip(x, y):
            f = {
                "x": tf.train.Feature(float_list=tf.train.FloatList(value=row)),
                "y": tf.train.Feature(int64_list=tf.train.Int64List(value=[int(label)])),
            }
            w.write(tf.train.Example(features=tf.train.Features(feature=f)).SerializeToString())


def write_csv(path: str, x, y) -> None:
    """One CSV file with a header (x0, x1, ..., y) and a row per row of `x` (floats as Python writes them)."""
    with open(path, "w") as f:
        f.write(",".join([f"x{i}" for i in range(x.shape[1])] + ["y"]) + "\n")
        f.writelines(",".join(map(repr, row.tolist())) + f",{label}\n" for row, label in zip(x, y))


def write_data(root: str, width: int, classes: int, source: str, seed: int = 0) -> None:
    """`SHARDS * PER_SHARD` records {x: float32[width], y: int64 in [0, classes)} as `source` is read
    (`overrides`): `SHARDS` TFRecord files of `PER_SHARD` records, one uncompressed `data.npz` (x, y) or
    one `data.csv` (columns x0.., y); the same records in the same order for every source."""
    import numpy as np

    os.makedirs(root, exist_ok=True)
    x = np.random.default_rng(seed).random((SHARDS * PER_SHARD, width), dtype=np.float32)
    y = (x[:, 0] * classes).astype(np.int64)
    if source == "npz":
        np.savez(os.path.join(root, "data.npz"), x=x, y=y)
    elif source == "csv":
        write_csv(os.path.join(root, "data.csv"), x, y)
    else:
        for s in range(SHARDS):
            part = slice(s * PER_SHARD, (s + 1) * PER_SHARD)
            write_tfrecord(os.path.join(root, f"part-{s:03d}.tfrecord"), x[part], y[part])


def overrides(size: str, root: str, stream: bool, source: str = "tfrecord") -> list[str]:
    width, batch, floats = SIZES[size]
    model = [] if size == "default" else [f"model.width={width}"]
    data = {
        "npz": ["data=npz", f"data.path={root}/data.npz", "data.x=x"],
        "csv": ["data=csv", f"data.path={root}/data.csv"],
        "tfrecord": [
            "data=tfrecord",
            f"data.path={root}/*.tfrecord",
            f"data.features={{x: 'float32[{floats}]', y: int64}}",
        ],
    }[source]
    return [
        *model,
        *data,
        "data.y=y",
        f"data.batch_size={batch}",
        "data.classes={label: 10}",
        "data.val_fraction=0",
        f"data.stream={str(stream).lower()}",
        "trainer.progress=false",
        "trainer.steps=1000000",
    ]


def stream_rate(run, batches: int) -> float:
    """Examples/second of `batches` batches of the run's stream, after one untimed batch."""
    it = iter(run.batches())
    next(it)
    t0 = time.perf_counter()
    for _ in range(batches):
        next(it)
    return batches * run.examples_per_step / (time.perf_counter() - t0)


def train_rate(run, calls: int) -> float:
    """Steps/second of `calls` calls of `trainer.steps_per_call` steps on the run's own stream, after one
    untimed call (the first of a run traces)."""
    n = run.settings.trainer.steps_per_call
    run.steps(n)
    t0 = time.perf_counter()
    for _ in range(calls):
        run.steps(n)
    return calls * n / (time.perf_counter() - t0)


def measure(
    size: str, repeats: int, calls: int, batches: int, root: str, rng: random.Random, source: str = "tfrecord"
) -> dict:
    """Per repeat: the stream alone and training, in memory and streamed (random order); the ratios."""
    import chain

    runs = {s: chain.build(chain.compose(overrides(size, root, s, source))) for s in (False, True)}
    rates: dict[tuple[str, bool], list[float]] = {(k, s): [] for k in ("stream", "train") for s in (False, True)}
    for _ in range(repeats):
        order = [(k, s) for k in ("stream", "train") for s in (False, True)]
        rng.shuffle(order)
        for k, s in order:
            rates[k, s].append(stream_rate(runs[s], batches) if k == "stream" else train_rate(runs[s], calls))
    out = {}
    for k in ("stream", "train"):
        ratios = [b / a for a, b in zip(rates[k, False], rates[k, True])]
        out[k] = {
            "memory": statistics.median(rates[k, False]),
            "streamed": statistics.median(rates[k, True]),
            "ratio": statistics.median(ratios),
            "min": min(ratios),
            "max": max(ratios),
        }
    return out


def identity_cost(size: str, root: str, source: str, repeats: int, calls: int) -> dict:
    """The file check of a resume (stamp every file, compare with the stamps a checkpoint recorded) and
    the step time of the streamed run, each the median of `repeats` (the check and a block of training
    alternated)."""
    import chain
    from chain.data import identity

    run = chain.build(chain.compose(overrides(size, root, True, source)))
    saved = identity.stamps(run.dataset.shards)  # what the checkpoint recorded
    checks, steps = [], []
    for _ in range(repeats):
        t0 = time.perf_counter()
        found = identity.changes(saved, identity.stamps(run.dataset.shards))
        checks.append(time.perf_counter() - t0)
        assert not found, found
        steps.append(1 / train_rate(run, calls))
    sizes = [f.size for f in saved.files]
    return {
        "check_s": statistics.median(checks),
        "step_s": statistics.median(steps),
        "files": len(sizes),
        "bytes": sum(sizes),
        "schemes": sorted({f.digest.partition(":")[0] for f in saved.files}),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="default,large")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--calls", type=int, default=20, help="timed calls (of trainer.steps_per_call steps) per block")
    ap.add_argument("--batches", type=int, default=200, help="timed batches of the stream alone per block")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--source",
        choices=["tfrecord", "npz", "csv"],
        default="tfrecord",
        help="the files both runs read: TFRecord shards, or the same records in one uncompressed .npz or one CSV file",
    )
    ap.add_argument("--markdown", action="store_true", help="print the table for docs/benchmarks.md")
    ap.add_argument(
        "--identity",
        action="store_true",
        help="measure the stream's file check (chain.data.identity) against 1000 steps of the run",
    )
    a = ap.parse_args(argv)
    rng = random.Random(a.seed)
    load = subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
    if a.identity:
        with tempfile.TemporaryDirectory(prefix="bench_input_") as tmp:
            print(
                f"{a.source}; {a.repeats} repeats; training: {a.calls} calls of 8 steps a repeat; load before: {load}"
            )
            for size in a.sizes.split(","):
                root = os.path.join(tmp, size)
                write_data(root, SIZES[size][2], 10, a.source)
                r = identity_cost(size, root, a.source, a.repeats, a.calls)
                run_s = 1000 * r["step_s"]
                print(
                    f"{size:8s} check {1000 * r['check_s']:.2f} ms ({r['files']} file(s), {r['bytes'] / 2**20:.1f} MiB, "
                    f"digest {'/'.join(r['schemes'])})  step {1000 * r['step_s']:.2f} ms  1000 steps {run_s:.1f} s  "
                    f"check / 1000 steps {100 * r['check_s'] / run_s:.4f}%"
                )
        return 0
    results = {}
    with tempfile.TemporaryDirectory(prefix="bench_input_") as tmp:
        for size in a.sizes.split(","):
            root = os.path.join(tmp, size)
            write_data(root, SIZES[size][2], 10, a.source)
            results[size] = measure(size, a.repeats, a.calls, a.batches, root, rng, a.source)
    head = (
        f"{a.source}; {a.repeats} paired repeats; stream alone: {a.batches} batches a block; "
        f"training: {a.calls} calls of 8 steps a block; load before: {load}"
    )
    if a.markdown:
        print(head + "\n")
        print("| model | measured | in memory | streamed | streamed / in memory (median, min-max) |")
        print("|---|---|---|---|---|")
        for size, r in results.items():
            width, batch, floats = SIZES[size]
            name = f"{size} (width {width}, batch {batch}, {floats} floats)"
            for k, unit in (("stream", "examples/s"), ("train", "steps/s")):
                v = r[k]
                what = "stream alone" if k == "stream" else "training"
                print(
                    f"| {name} | {what} ({unit}) | {v['memory']:.0f} | {v['streamed']:.0f} | "
                    f"**{v['ratio']:.3f}** ({v['min']:.3f}-{v['max']:.3f}) |"
                )
    else:
        print(head)
        for size, r in results.items():
            for k, v in r.items():
                print(
                    f"{size:8s} {k:7s} in memory {v['memory']:10.1f}  streamed {v['streamed']:10.1f}  "
                    f"ratio {v['ratio']:.3f} ({v['min']:.3f}-{v['max']:.3f})"
                )
    return 0


if __name__ == "__main__":
    sys.exit(main())
