"""The trainer's steps per second against Keras' own `model.fit` (or a hand-written loop) doing the same math.

    python scripts/bench_overhead.py --markdown              # vs Keras fit: e2e1 e2e2 e2e2x, small and large
    python scripts/bench_overhead.py --ablate --repeats 10   # the same, and where the difference goes
    python scripts/bench_overhead.py --anchor hand           # vs a hand-written loop (local1, fit8 fit32 ...)

Not a test: it prints medians and ratios (and, with --markdown, a table for docs/benchmarks.md).

Everything runs in one process (two logical CPU devices); the loops under comparison take
turns: each repeat runs one block of steps of every loop, in a random order, so that drift
on a shared machine hits all of them alike, and every block starts with 2 untimed steps (one
untimed call) of its own (the block before trained another model). A ratio is steps/second
of a loop over steps/second of the anchor: the median of the per-repeat (paired) ratios,
with a 95% bootstrap interval, on the wall clock and on the process's CPU time. Sizes (the
issue's): small = width 256, batch 64; large = width 1024, batch 256; two Dense layers per
stage, Adam, synthetic data with 128 features, no validation split (an evaluation at the end
of a timed block would be timed).

Anchors:

- `keras` (default): `keras{N}`, Keras' `model.fit(steps_per_execution=N)` (N = the first
  `--calls`, default 8 = the trainer's default `trainer.steps_per_call`) on the chain's
  stages cloned into one `keras.Sequential` on /CPU:0 with the trainer's initial weights,
  Keras' own Adam with the stages' settings and the same loss (`jit_compile=False`, Keras' own
  choice on a CPU-only machine), on the trainer's own `tf.data` stream; timed from one
  execution's `on_train_batch_end` to the last. Before timing, two steps of Keras' fit and of
  the trainer with Keras' Adam (`optim.fused=false`) on the same batches must give the same
  weights (the default's fused kernel rounds `1 - beta` in the last bit where Keras' does not;
  tests/test_fused.py holds it to Keras' Adam).
- `hand`: `x, ys = next(it); step(x, ys["label"])` on a hand-written `tf.function` with the
  stages' own optimizer class (one step per call, the loss not read); two steps of it and of
  the trainer must give the same losses.

Cases (the trainer's config):

- `e2e1`: mode=e2e, one stage on /CPU:0; `e2e2`: two stages, both on /CPU:0; `e2e2x`: two
  stages on two logical devices (/CPU:0, /CPU:1: one thread pool, so copies and partitions
  cost, nothing overlaps); one microbatch (the default);
- `local1` (the hand anchor's default): mode=local, one stage: its body and read-out head
  with one loss and one Adam.

Loops:

- `fitN`: `Run.fit`'s loop with `trainer.steps_per_call=N`, timed from one step's callback
  to the next (the report read and judged included); `fit` the same with one step per call;
- `step` (hand anchor): `Run.step(x, y)`, the public API, which checks each batch;
- `guarded` (hand anchor): the hand-written loop plus the trainer's numerics guard;
- `kerasadamN` (keras anchor, `--keras-adam`): `fitN` on a run with `optim.fused=false` (Keras' own
  Adam update, twelve ops a variable, where the default, TensorFlow's fused kernel, is one: the
  same math within float32 rounding, not bit for bit); its row also shows its speed over `fitN`'s, paired;
- with `--ablate` (keras anchor), `fitN` on fresh runs whose step adds or leaves out one
  piece (`ablated`): `rebuilt` (nothing: the control), `ordered`, `noguard`, `noreport`,
  `bare`, `nostall`; each row also shows its speed over `fitN`'s, paired (`--ablations`: some of them).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import random
import statistics
import subprocess
import sys
import time
from typing import Callable

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
SIZES = {"small": (256, 64), "large": (1024, 256)}
WARM = 2  # untimed steps at the start of every block


CASES = {
    "local1": ["+stages=1", "placement.devices=[/CPU:0]"],
    "e2e1": ["+stages=1", "placement.devices=[/CPU:0]", "mode=e2e"],
    "e2e2": ["+stages=2", "placement.devices=[/CPU:0,/CPU:0]", "mode=e2e"],
    "e2e2x": ["+stages=2", "placement.devices=[/CPU:0,/CPU:1]", "mode=e2e"],
}
ABLATIONS = ("rebuilt", "ordered", "noguard", "noreport", "bare", "nostall")


def overrides(size: str, case: str) -> list[str]:
    width, batch = SIZES[size]
    base = [
        "model=mlp",
        f"model.width={width}",
        "model.depth=2",
        "optim=adam",
        "data=synthetic",
        "data.features=128",
        "data.samples=8192",
        "data.classes=10",
        "data.val_fraction=0",
        f"data.batch_size={batch}",
        "trainer.progress=false",
        "trainer.log_every=1000000",
        "trainer.steps=1000000",
    ]
    return base + CASES[case]


def clone(run):
    """The chain's stages (bodies, heads, read-out) cloned into one `keras.Sequential` on /CPU:0,
    with the trainer's initial weights, and an Adam of the stages' own class with their settings (built)."""
    import keras
    import tensorflow as tf

    parts = [p for s in run.stages for p in ([s.model] + ([s.head] if s.head is not None else []))]
    source = [layer for p in parts for layer in p.layers]
    with tf.device("/CPU:0"):
        layers = [
            layer.__class__.from_config({**layer.get_config(), "name": f"hand_{i}"}) for i, layer in enumerate(source)
        ]
        model = keras.Sequential([keras.Input(run.dataset.input_shape), *layers])
        for a, b in zip(layers, source):
            a.set_weights(b.get_weights())
        o = run.settings.stages[0].optim
        opt = type(run.stages[0].optimizer)(learning_rate=o.lr, beta_1=o.beta_1, beta_2=o.beta_2)
        opt.build(model.trainable_variables)
    return model, opt


def hand_written(run, guard: bool = False):
    """`step(x, y) -> loss`: the chain's math written by hand on /CPU:0, from its layers' configs and weights.
    `guard`: the update only when the loss and gradients are finite (`chain.steps.numerics.all_finite`
    and a `tf.cond`, as the trainer's guard does), to measure what the guard costs."""
    import tensorflow as tf

    from chain.stages.losses import make
    from chain.steps.numerics import all_finite

    model, opt = clone(run)
    loss_fn = make("sparse_categorical_crossentropy", run.stages[-1].target)

    @tf.function
    def step(x, y):
        with tf.device("/CPU:0"):
            with tf.GradientTape() as tape:
                loss = loss_fn(y, model(x, training=True))
            grads = tape.gradient(loss, model.trainable_variables)

            def update():
                opt.apply_gradients(zip(grads, model.trainable_variables))
                return tf.constant(True)

            if guard:
                tf.cond(all_finite(loss, grads), update, lambda: tf.constant(False))
            else:
                update()
        return loss

    return step


def keras_fit(run, per_call: int, reference) -> Callable:
    """`block(n)`: Keras' own `model.fit(steps_per_execution=per_call)` on the chain's model cloned into
    one `keras.Sequential` on /CPU:0 (`clone`), the same Adam, loss, batches and data pipeline;
    timed like the trainer's `fit`, from one call's end (`on_train_batch_end`, once per
    execution) to the last one's. `reference`: the trainer's stages after two steps on the
    stream's first two batches; Keras' two steps on them must give the same weights."""
    import keras
    import numpy as np

    model, _ = clone(run)
    o = run.settings.stages[0].optim
    target = run.stages[-1].target.name
    data = run.batches().map(lambda x, ys: (x, ys[target]))

    def compile_(n):
        model.compile(
            optimizer=keras.optimizers.Adam(learning_rate=o.lr, beta_1=o.beta_1, beta_2=o.beta_2),
            loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            steps_per_execution=n,
            jit_compile=False,
        )

    compile_(1)
    model.fit(data.take(2), epochs=1, verbose=0, shuffle=False)
    ours = [
        w for s in reference for p in ([s.model] + ([s.head] if s.head is not None else [])) for w in p.get_weights()
    ]
    for a, b in zip(model.get_weights(), ours):
        if not np.allclose(a, b, rtol=1e-5, atol=1e-6):
            raise SystemExit(f"Keras' fit does not do the chain's math (max difference {np.max(np.abs(a - b))})")
    compile_(per_call)

    def block(n):  # n: a whole number of calls
        warm = -(-WARM // per_call)  # untimed calls
        stamps = []
        stamp = keras.callbacks.LambdaCallback(on_train_batch_end=lambda batch, logs: stamps.append(clock()))
        model.fit(data, epochs=1, steps_per_epoch=warm * per_call + n, verbose=0, callbacks=[stamp], shuffle=False)
        return per_step(stamps[warm - 1], stamps[-1], n)

    return block


def clock():
    return time.perf_counter(), time.process_time()


def per_step(t0, t1, n):
    return (t1[0] - t0[0]) / n, (t1[1] - t0[1]) / n


def ablated(size: str, case: str, what: str):
    """A fresh run of `case` whose compiled step adds or leaves out one piece of the trainer's
    machinery (what it costs is the difference to `rebuilt`, the control, which changes
    nothing): `ordered` keeps the per-action control dependencies and the host releases after
    sending actions even at one microbatch (the step before they were left out there:
    `chain.pipeline.play`); `noguard` applies every update unconditionally (no `tf.cond`, no
    verdict to wait for); `noreport` returns a constant report (no stacking, no copies to the
    last device; the host reads zeros); `bare` leaves out all three (and the control
    dependencies at any number of microbatches); `nostall` is the run with `trainer.stall_s=0`: no
    progress markers in the step (`chain.pipeline.progress`), no watch thread. Timing only: not the
    trainer's results."""
    from unittest import mock

    import ablations
    import tensorflow as tf

    import chain
    from chain.pipeline.play import e2e_step
    from chain.steps import update

    names = {"bare": ("noguard", "unordered", "noreport"), "rebuilt": ()}.get(what, (what,))
    run = chain.build(chain.compose(overrides(size, case) + (["trainer.stall_s=0"] if "nostall" in names else [])))
    st = run.strategy
    t = run.settings.trainer
    chaining = [ablations.UNORDERED] if "unordered" in names else [ablations.ORDERED] if "ordered" in names else []
    body = ablations.ablated_step(
        lambda: e2e_step(
            st.stages, st.schedule, st.loss_fn(), st.target, t.grad_accum, t.jit_compile, progress=st.progress
        ),  # the trainer's markers (trainer.stall_s), None under nostall
        *chaining,
    )

    def unguarded(skipped, finite, apply):
        apply()
        return tf.constant(False)

    def step(x, ys):
        with mock.patch.object(update, "guarded_update", unguarded) if "noguard" in names else mock.MagicMock():
            out = body(x, ys)
        return tf.zeros([st.layout.size]) if "noreport" in names else out

    st.set_step(step)
    return run


def loops(
    size: str,
    case: str,
    calls: list[int],
    anchor: str,
    ablate: bool,
    keras_adam: bool = False,
    ablations: tuple[str, ...] = ABLATIONS,
) -> dict:
    """name -> block(n): (wall, CPU) seconds per step over a block of n steps."""
    import chain

    settings = chain.compose(overrides(size, case))
    run = chain.build(settings)

    def block_fit(n, per_call=1, r=run):
        warm = -(-WARM // per_call) * per_call  # whole calls
        trainer = dataclasses.replace(r.settings.trainer, steps=r.global_step + warm + n, steps_per_call=per_call)
        r.settings = dataclasses.replace(r.settings, trainer=trainer)
        stamps = []
        r.fit(callback=lambda step, out: stamps.append(clock()))
        return per_step(stamps[warm - 1], stamps[-1], n)

    def whole(k, n):
        return max(k, n // k * k)

    if anchor == "keras":
        out = {}
        # Keras' fit must do the same math (`keras_fit` compares the weights), checked with Keras' own Adam:
        # the fused kernel (the default) rounds 1 - beta in the last bit, which two steps of Adam over
        # ReLU layers carry to 1e-4 (tests/test_fused.py holds the kernel to Keras' Adam).
        reference = chain.build(chain.compose(overrides(size, case) + ["optim.fused=false"]))
        first = iter(reference.batches())
        for _ in range(2):
            reference.step(*next(first))
        for k in calls:
            out[f"keras{k}"] = lambda n, f=keras_fit(run, k, reference.stages), k=k: f(whole(k, n))  # noqa: B008 (one fit per k)
            out[f"fit{k}"] = lambda n, k=k: block_fit(whole(k, n), k)
        if keras_adam:
            k, kr = calls[0], chain.build(chain.compose(overrides(size, case) + ["optim.fused=false"]))
            out[f"kerasadam{k}"] = lambda n, k=k, r=kr: block_fit(whole(k, n), k, r)
        if ablate:
            k = calls[0]
            for what in ablations:
                if case == "local1":
                    raise SystemExit("--ablate is for the e2e cases")
                r = ablated(size, case, what)
                out[what] = lambda n, r=r, k=k: block_fit(whole(k, n), k, r)
        return out

    hand, guarded = hand_written(run), hand_written(run, guard=True)
    check = iter(run.batches())
    for _ in range(2):  # the same math: the same losses on the same batches
        x, ys = next(check)
        a, b = run.step(x, ys)["loss"], float(hand(x, ys["label"]))
        if abs(a - b) > 1e-5 * max(1.0, abs(b)):
            raise SystemExit(f"{size} {case}: the hand-written loop does not do the chain's math ({a} vs {b})")
    hand_it, guarded_it = iter(run.batches()), iter(run.batches())

    def block_hand(n, fn=hand, it=hand_it):
        for i in range(WARM + n):
            if i == WARM:
                t0 = clock()
            x, ys = next(it)
            fn(x, ys["label"])
        return per_step(t0, clock(), n)

    def block_step(n):
        for i in range(WARM + n):
            if i == WARM:
                t0 = clock()
            run.step(*next(run.iterator))
        return per_step(t0, clock(), n)

    out = {
        "hand": block_hand,
        "fit": block_fit,
        "step": block_step,
        "guarded": lambda n: block_hand(n, guarded, guarded_it),
    }
    for k in calls:
        out[f"fit{k}"] = lambda n, k=k: block_fit(whole(k, n), k)
    return out


def bootstrap(paired: list[float], rounds: int = 2000) -> tuple[float, float]:
    rng = random.Random(0)
    meds = sorted(statistics.median(rng.choices(paired, k=len(paired))) for _ in range(rounds))
    return meds[int(0.025 * rounds)], meds[int(0.975 * rounds) - 1]


def measure(size: str, case: str, a) -> dict:
    fns = loops(size, case, a.calls, a.anchor, a.ablate, a.keras_adam, tuple(a.ablations))
    block = a.block if size == "small" else a.block_large
    for fn in fns.values():  # trace, allocate, warm the caches
        fn(max(block // 4, 4))
    rng = random.Random(0)
    wall = {n: [] for n in fns}
    cpu = {n: [] for n in fns}
    for _ in range(a.repeats):
        for name in rng.sample(list(fns), len(fns)):
            w, c = fns[name](block)
            wall[name].append(w)
            cpu[name].append(c)
    return {"wall": wall, "cpu": cpu}


def paired(times: list[float], anchor: list[float]) -> tuple[float, tuple[float, float]]:
    """Median of the per-repeat ratios anchor time / time (steps per second over the anchor's), 95% CI."""
    ratios = [h / t for h, t in zip(anchor, times)]
    return statistics.median(ratios), bootstrap(ratios)


def rows(size: str, case: str, times: dict, anchor: str, base: str) -> list[dict]:
    """One row per loop but the anchor: its speed over the anchor's (wall and CPU clocks) and,
    for ablations, over `base` (the trainer's loop they modify: > 1 is what the piece costs)."""
    out = []
    for name in times["wall"]:
        if name == anchor:
            continue
        row = {"size": size, "case": case, "loop": name}
        for clock in ("wall", "cpu"):
            row[clock], row[f"{clock}_ci"] = paired(times[clock][name], times[clock][anchor])
        compared = name in ABLATIONS or name.startswith("kerasadam")
        row["vs_base"] = paired(times["wall"][name], times["wall"][base]) if compared else None
        row["ms"] = statistics.median(times["wall"][name]) * 1e3
        row["anchor_ms"] = statistics.median(times["wall"][anchor]) * 1e3
        out.append(row)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument(
        "--anchor",
        choices=["keras", "hand"],
        default="keras",
        help="keras: Keras' model.fit(steps_per_execution=N); hand: a hand-written loop, one step per call",
    )
    p.add_argument("--sizes", nargs="+", default=list(SIZES), choices=list(SIZES))
    p.add_argument(
        "--cases", nargs="+", default=None, choices=list(CASES), help="default: e2e1 e2e2 e2e2x (keras), local1 (hand)"
    )
    p.add_argument(
        "--calls",
        nargs="*",
        type=int,
        default=None,
        help="trainer.steps_per_call values to time (default: 8 (keras), 8 32 (hand))",
    )
    p.add_argument("--ablate", action="store_true", help="also time the trainer without each piece (keras anchor)")
    p.add_argument(
        "--ablations",
        nargs="+",
        default=list(ABLATIONS),
        choices=list(ABLATIONS),
        help="with --ablate: which pieces (default: all)",
    )
    p.add_argument(
        "--keras-adam",
        action="store_true",
        help="also time the trainer with optim.fused=false: Keras' own Adam update (keras anchor)",
    )
    p.add_argument("--repeats", type=int, default=25)
    p.add_argument("--block", type=int, default=32, help="steps per timed block (small)")
    p.add_argument(
        "--block-large", type=int, default=None, help="steps per timed block (large; default 16 keras, 8 hand)"
    )
    p.add_argument("--markdown", action="store_true", help="also print a table for docs/benchmarks.md")
    a = p.parse_args()
    keras_anchor = a.anchor == "keras"
    a.cases = a.cases or (["e2e1", "e2e2", "e2e2x"] if keras_anchor else ["local1"])
    a.calls = a.calls or ([8] if keras_anchor else [8, 32])
    a.block_large = a.block_large or (16 if keras_anchor else 8)
    anchor = f"keras{a.calls[0]}" if keras_anchor else "hand"
    base = f"fit{a.calls[0]}"

    import tensorflow as tf

    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
    tf.config.list_logical_devices()  # start the runtime now: the planner of a 1-stage run would make it one device
    load = subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
    print(f"start: {load}", flush=True)
    table = []
    for size in a.sizes:
        for case in a.cases:
            print(f"== {size} {case} (anchor {anchor})", flush=True)
            for r in rows(size, case, measure(size, case, a), anchor, base):
                table.append(r)
                extra = f"  vs {base} {r['vs_base'][0]:.3f}" if r["vs_base"] else ""
                print(
                    f"  {r['loop']:9s} steps/s vs {anchor}: wall {r['wall']:.3f} [{r['wall_ci'][0]:.3f}-"
                    f"{r['wall_ci'][1]:.3f}]  CPU {r['cpu']:.3f}   ({r['ms']:.3f} ms/step; {anchor} "
                    f"{r['anchor_ms']:.3f}){extra}",
                    flush=True,
                )
    end = subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
    print(f"end: {end}")
    if a.markdown:
        print(
            f"\n| size | case | loop | ratio to {anchor} (wall, median paired) | 95% CI | ratio (CPU) | "
            f"vs {base} | ms/step | {anchor} ms/step |"
        )
        print("|---|---|---|---|---|---|---|---|---|")
        for r in table:
            vs = f"{r['vs_base'][0]:.3f}" if r["vs_base"] else ""
            print(
                f"| {r['size']} | {r['case']} | {r['loop']} | {r['wall']:.3f} | {r['wall_ci'][0]:.3f}-"
                f"{r['wall_ci'][1]:.3f} | {r['cpu']:.3f} | {vs} | {r['ms']:.3f} | {r['anchor_ms']:.3f} |"
            )
    sys.stdout.flush()


if __name__ == "__main__":
    main()
