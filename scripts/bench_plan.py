"""`placement.plan=auto` against a grid of plans, each measured end to end on two single-core workers.

    python scripts/bench_plan.py                           # three models, 28 plans each, 5 rounds
    python scripts/bench_plan.py --models wide --repeats 9 --markdown
    python scripts/bench_plan.py --models gpt2 --small-grid --repeats 3 --markdown   # 14 plans
    python scripts/bench_plan.py --quick                   # smoke: tiny models, a few plans, 1 repeat

Not a test: it prints a table (`--markdown` also prints one for docs/benchmarks.md) and appends each
plan's measured (and predicted) step to `--findings` (dated lines).

The method of `bench_pipeline.py`: two `python -m chain.worker --cpus i --threads 1` processes (each
pinned to core i, one op at a time, like an accelerator with one stream); this process is the client
and builds every plan with `chain.build` and `cluster.workers=[...]`, the trainer's own path. Each model
is one Keras model cut into stages (`chain.build(cfg, model=...)`, as `model=keras` cuts a file), so the
search may choose its cut:

- `wide`: 8 Dense(1024, tanh) and a 10-class read-out (bench_pipeline.py's layers), batch 256;
- `deep`: 16 Dense(256, tanh) and the read-out (narrow and deep: many short actions), batch 256;
- `transformer`: a small pre-norm transformer encoder written here (4 blocks of 4-head attention and a 4x
  feed-forward, width 128, 32 positions, mean-pooled), batch 64;
- `mobilenet`: keras.applications MobileNetV2 (alpha 0.35, weights=None, 32x32x3, 10 classes), batch 64
  (not in the default run: 155 layers, each of the 28 plans takes minutes to build on 2 shared cores);
- `gpt2`: keras_hub's GPT2CausalLM, `scripts/bench_lm.py`'s (vocab 512, 128 positions, width 128, 4 blocks of 4
  heads, called on token ids with its padding mask all ones inside: the mask crosses every cut between the
  blocks beside the hidden state), batch 32 of a token file's windows (`data=tokens`), the next token's loss at
  every position (not in the default run: each plan's first steps trace for seconds; `--small-grid` times 14
  of the 28 plans);
- `gpt`: `model=gpt`, chain's own decoder of the same size on the same data (the config builds it: no Keras
  model given; not in the default run either).

SGD, float32, `trainer.steps_per_call=1` (a call of the compiled step is one step). For each model,
first `placement.plan=auto` plans on the two workers (`chain.autoplan.settle.measured`, then
`chain.autoplan.choice.choose`: what the build's `settle.settle` does; the measurements cached in a
scratch run directory), then the grid: copies R and stages K in {K=1 R=1, K=1 R=2, K=2 R=1} x M in
{1, 2, 4, 8} x schedule in {gpipe, 1f1b, zb1} (K=1 has one schedule: gpipe), 1F1B and GPipe with
`recompute=always` at M = 4 and 8, interleaved and zbv (K=4 on the two workers) at M = 4 and 8: 28 plans
where all are legal. Each plan is a `Candidate` of the search itself (`chain.autoplan.search.candidates`
on the measured costs: its cut and devices are the ones plan=auto would run), with its predicted step
(`choice.predict`); the plan auto chose is in the grid (added when the grid lacks it), and the run
plan=auto builds is timed beside it (`auto/hand`: the same plan, so about 1).

Each plan's step is timed through `Run.strategy.call` (the call `fit` makes) on a batch that starts on
this process, as `Run` feeds it, after `--warmup` calls; the plans are timed in `--repeats` rounds, each
round in a rotated order (drift hits every plan alike), and each measurement records the CPU other
processes took meanwhile (cores; on 2 cores anything else running steals from a worker). Per plan: the
median step over rounds, and over the quiet measurements (other processes below `--quiet` cores).
Per model: the chosen plan's rank among the grid (by median), the median over rounds of the paired
ratio time(chosen) / time(best plan) (goal <= 1.10), its predicted / measured step (goal within 15%),
and how long planning took (measuring, searching). The workers get SIGTERM when the script ends.
"""

from __future__ import annotations

import argparse
import datetime
import os
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, replace

from bench_pipeline import kernel_name, timed

from chain.worker import LocalCluster

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

FINDINGS = "/work/briefs/s3/benchplan-findings.md"
MODELS = ("wide", "deep", "transformer", "mobilenet", "gpt2", "gpt")
# (K, R) x M x schedule: the grid (module docstring); recompute=always and the two-stages-per-device
# schedules fill it where K=1 has one schedule only.
GRID = (
    [(1, 1, m, "gpipe", "never") for m in (1, 2, 4, 8)]
    + [(1, 2, m, "gpipe", "never") for m in (1, 2, 4, 8)]
    + [(2, 1, m, s, "never") for m in (1, 2, 4, 8) for s in ("gpipe", "1f1b", "zb1")]
    + [(2, 1, m, s, "always") for m in (4, 8) for s in ("gpipe", "1f1b")]
    + [(4, 1, m, s, "never") for m in (4, 8) for s in ("interleaved", "zbv")]
)
# half of GRID (--small-grid): the copies at every M, the pipelines at M = 4 and 8, for a model whose 28 plans
# outlast a quiet slot (gpt2: each plan's first steps trace for seconds)
SMALL_GRID = (
    [(1, 1, m, "gpipe", "never") for m in (1, 4)]
    + [(1, 2, m, "gpipe", "never") for m in (1, 2, 4, 8)]
    + [(2, 1, m, s, "never") for m in (4, 8) for s in ("gpipe", "1f1b", "zb1")]
    + [(4, 1, 8, s, "never") for s in ("interleaved", "zbv")]
)
QUICK_GRID = [
    (1, 1, 1, "gpipe", "never"),
    (1, 2, 1, "gpipe", "never"),
    (2, 1, 2, "1f1b", "never"),
    (2, 1, 2, "zb1", "never"),
]


@dataclass(frozen=True)
class Shape:
    """A benchmark model: its layers and its global batch."""

    name: str
    batch: int
    width: int = 0
    depth: int = 0
    image: bool = False
    seq: int = 0  # a transformer: its sequence length (its input is seq x width floats, flattened)
    vocab: int = 0  # a language model: its vocabulary (its input is seq token ids, its target the next at each)
    gpt: bool = False  # model=gpt of width x depth: the config builds it


def shapes(quick: bool) -> dict[str, Shape]:
    if quick:
        return {
            "wide": Shape("wide", 32, 64, 4),
            "deep": Shape("deep", 32, 16, 8),
            "transformer": Shape("transformer", 8, 16, 2, seq=8),
            "mobilenet": Shape("mobilenet", 8, image=True),
            "gpt2": Shape("gpt2", 8, 16, 2, seq=8, vocab=64),
            "gpt": Shape("gpt", 8, 16, 2, seq=8, vocab=64, gpt=True),
        }
    return {
        "wide": Shape("wide", 256, 1024, 8),
        "deep": Shape("deep", 256, 256, 16),
        "transformer": Shape("transformer", 64, 128, 4, seq=32),
        "mobilenet": Shape("mobilenet", 64, image=True),
        "gpt2": Shape("gpt2", 32, 128, 4, seq=128, vocab=512),
        "gpt": Shape("gpt", 32, 128, 4, seq=128, vocab=512, gpt=True),
    }


def make(shape: Shape):
    """The model, its weights seeded (every plan starts from the same); None: model=gpt's, the config's own."""
    import keras

    keras.utils.set_random_seed(0)
    if shape.gpt:
        return None
    if shape.image:
        return keras.applications.MobileNetV2(
            weights=None, input_shape=(32, 32, 3), classes=10, alpha=0.35, classifier_activation=None
        )
    if shape.vocab:  # bench_lm.py's model on token ids
        from types import SimpleNamespace

        from bench_lm import gpt2

        return gpt2(SimpleNamespace(vocab=shape.vocab, seq=shape.seq, hidden=shape.width, layers=shape.depth, heads=4))[
            1
        ]
    if shape.seq:
        return transformer(shape)
    x = keras.Input((shape.width,))
    h = x
    for i in range(shape.depth):
        h = keras.layers.Dense(shape.width, activation="tanh", name=f"dense_{i}")(h)
    return keras.Model(x, keras.layers.Dense(10, name="readout")(h), name=shape.name)


def transformer(shape: Shape):
    """A small pre-norm transformer encoder, written here: `depth` blocks (4-head self-attention and a 4x
    feed-forward, each a residual) over `seq` positions of `width` features, mean-pooled into the read-out.
    Its input is flat (the synthetic data's vectors), reshaped first."""
    import keras

    L = keras.layers
    x = keras.Input((shape.seq * shape.width,))
    h = L.Reshape((shape.seq, shape.width))(x)
    for i in range(shape.depth):
        a = L.LayerNormalization(name=f"ln_a{i}")(h)
        a = L.MultiHeadAttention(4, shape.width // 4, name=f"attention_{i}")(a, a)
        h = L.Add(name=f"residual_a{i}")([h, a])
        f = L.LayerNormalization(name=f"ln_f{i}")(h)
        f = L.Dense(4 * shape.width, activation="gelu", name=f"up_{i}")(f)
        f = L.Dense(shape.width, name=f"down_{i}")(f)
        h = L.Add(name=f"residual_f{i}")([h, f])
    h = L.GlobalAveragePooling1D()(L.LayerNormalization(name="ln_out")(h))
    return keras.Model(x, L.Dense(10, name="readout")(h), name="transformer")


def base_overrides(shape: Shape, cluster_option: str, scratch: str) -> list[str]:
    """The user's settings every plan shares: model, data (its shape), optimizer, the workers."""
    if shape.image:
        import numpy as np

        path = os.path.join(scratch, "images.npz")
        n = max(shape.batch, 20)  # every class present: the data's classes are the labels seen
        np.savez(
            path,
            x=np.random.default_rng(0).normal(size=(n, 32, 32, 3)).astype("float32"),
            y=(np.arange(n) % 10).astype("int64"),
        )
        data = ["data=npz", f"data.path={path}", "data.y=y"]
    elif shape.vocab:
        import numpy as np

        path = os.path.join(scratch, "tokens.bin")
        np.random.default_rng(0).integers(0, shape.vocab, 4 * shape.batch * (shape.seq + 1)).astype("uint16").tofile(
            path
        )
        data = ["data=tokens", f"data.path={path}", f"data.seq_len={shape.seq}", f"data.vocab={shape.vocab}"]
        if shape.gpt:
            width = [f"model.width={shape.width}", f"model.depth={shape.depth}", "model.heads=4"]
            data += ["model=gpt", f"model.vocab={shape.vocab}", *width]
    else:
        features = shape.width * (shape.seq or 1)
        data = ["data=synthetic", f"data.features={features}", "data.classes=10", f"data.samples={shape.batch}"]
    return [
        "mode=e2e",
        "optim=sgd",
        "optim.lr=0.001",
        *data,
        f"data.batch_size={shape.batch}",
        "data.val_fraction=0",
        "trainer.progress=false",
        "trainer.steps_per_call=1",
        "checkpoint.export=false",
        cluster_option,
        "cluster.lost_after_s=120",
    ]  # a loaded machine's worker may not answer the watchdog for 5 s


def host_batch(shape: Shape):
    """The global batch on this process's CPU (the client), where `Run` feeds it from."""
    import tensorflow as tf

    from chain.pipeline.play import host

    with tf.device(host()):
        if shape.vocab:  # token ids and the next token at each position, as data=tokens gives them
            x, y = (
                tf.random.stateless_uniform([shape.batch, shape.seq], [s, 2], maxval=shape.vocab, dtype=tf.int32)
                for s in (1, 2)
            )
            return x, {"next": y}
        dims = [shape.batch, 32, 32, 3] if shape.image else [shape.batch, shape.width * (shape.seq or 1)]
        x = tf.random.stateless_normal(dims, seed=[1, 2])
        y = tf.random.stateless_uniform(
            [shape.batch], seed=[2, 3], maxval=10, dtype=tf.int64 if shape.image else tf.int32
        )
    return x, {"label": y}


def plan_auto(shape: Shape, base: list[str], run_dir: str, budget: float | None):
    """plan=auto's own planning, the build's path (`budget`: placement.plan_budget_s, None: its default):
    the spec it plans from (placement applied), what it measured (cached in `run_dir`), the planned
    `RunSpec` and the seconds planning took."""
    import chain
    from chain.autoplan import choice, settle
    from chain.prepared import prepare
    from chain.training import build as building

    started = time.perf_counter()
    extra = [] if budget is None else [f"placement.plan_budget_s={budget}"]
    spec = prepare(chain.compose([*base, "placement.plan=auto", *extra]))
    spec = replace(spec, assignment=building.apply(spec))
    m = settle.measurement(spec, run_dir, make(shape))  # as `settle.settle` does
    plan = choice.choose(spec, m.costs, m.stage_cost)
    plan = replace(plan, measuring_s=0.0 if m.cached else m.costs.measuring_s, cached=m.cached, cache=m.cache)
    chosen = choice.chosen_spec(spec, plan)
    return spec, m, chosen, time.perf_counter() - started


def grid(shape: Shape, spec, m, chosen, wanted: list[tuple]) -> list:
    """The grid's candidates as the search makes them (its cut and devices), each with its predicted step
    (`choice.predict`, as the search predicts each); the chosen candidate added when the grid lacks it."""
    from chain.autoplan import choice, search

    found = {
        (c.stages, c.replicas, c.microbatches, c.schedule, c.recompute): c
        for c, _ in search.candidates(m.costs, shape.batch, choice.stage_counts(spec.settings, m.costs))
    }
    keys = [k for k in wanted if k in found]
    key = (chosen.stages, chosen.replicas, chosen.microbatches, chosen.schedule, chosen.recompute)
    if key not in keys:
        keys.append(key)
    out = []
    for k in keys:
        c = found[k]
        if k == key and c != chosen:  # the same search on the same costs: not expected
            print(f"# {shape.name}: the search's candidate {c} differs from the chosen {chosen}", flush=True)
            c = chosen
        out.append((c, choice.predict(spec, m.costs, c, m.stage_cost).step_s))
    return out


def name_of(c) -> str:
    """A plan's short name: K, R, M, schedule, recompute."""
    rc = "" if c.recompute == "never" else f" rc={c.recompute}"
    sched = "" if c.stages == 1 else f" {c.schedule}"
    return f"K={c.stages} R={c.replicas} M={c.microbatches}{sched}{rc}"


def median(values):
    return statistics.median(values) if values else None


def bench_model(a, shape: Shape, cluster, scratch: str) -> dict:
    """plan=auto, then the grid measured in rotating rounds (module docstring): the model's rows."""
    import chain

    base = base_overrides(shape, cluster.option, scratch)
    run_dir = os.path.join(scratch, shape.name)
    os.makedirs(run_dir, exist_ok=True)
    before, measured, spec, planning_s = plan_auto(shape, base, run_dir, a.plan_budget)
    plan, costs = spec.auto_plan, measured.costs
    chosen = plan.chosen.candidate
    print(
        f"# {shape.name}: plan=auto chose {name_of(chosen)} ({' '.join(chosen.overrides())}), predicted "
        f"{plan.chosen.step_s * 1e3:.1f} ms; planning {planning_s:.1f} s (measuring {plan.measuring_s:.1f} s, "
        f"searching {plan.searching_s:.2f} s, {plan.candidates} candidates)",
        flush=True,
    )
    plans = grid(shape, before, measured, chosen, QUICK_GRID if a.quick else SMALL_GRID if a.small_grid else GRID)
    x, ys = host_batch(shape)
    steps, started = [], time.time()
    for i, (c, _) in enumerate(plans):
        steps.append(chain.build(chain.compose([*base, *c.overrides()]), model=make(shape)).strategy.call)
        print(f"# {shape.name}: built {i + 1}/{len(plans)} at {time.time() - started:.0f} s", end="\r", flush=True)
    # the run plan=auto makes: timed beside its overrides written by hand
    steps.append(chain.build(spec, model=make(shape)).strategy.call)
    for _ in range(a.warmup):  # after every build: the first calls after another plan's build are slow
        for step in steps:
            step(x, ys)
    print(f"# {shape.name}: {len(plans)} plans built and warmed up in {time.time() - started:.0f} s", flush=True)
    pids = [os.getpid(), *cluster.pids]
    times = [[] for _ in steps]
    for r in range(a.repeats):
        n = len(steps)
        order = [(i + r * 5) % n for i in range(n)]
        if r % 2:
            order.reverse()
        for i in order:
            times[i].append(timed(steps[i], x, ys, a.steps, pids))
        print(
            f"# {shape.name}: round {r + 1} at {time.time() - started:.0f} s, load "
            f"{open('/proc/loadavg').read().split()[0]}",
            flush=True,
        )
    medians = [statistics.median(t[0] for t in ts) for ts in times]
    grid_medians = medians[: len(plans)]
    best = min(range(len(plans)), key=grid_medians.__getitem__)
    ci = next(i for i, (c, _) in enumerate(plans) if c == chosen)
    rank = 1 + sum(m < grid_medians[ci] for m in grid_medians)
    paired = [c[0] / b[0] for c, b in zip(times[ci], times[best])]
    quiet_paired = [c[0] / b[0] for c, b in zip(times[ci], times[best]) if max(c[1], b[1]) < a.quiet]
    rows = []
    for (c, predicted), ts, m in zip(plans, times, grid_medians):
        quiet = [t[0] for t in ts if t[1] < a.quiet]
        rows.append(
            dict(
                plan=name_of(c),
                overrides=" ".join(c.overrides()),
                measured_ms=m * 1e3,
                quiet=len(quiet),
                quiet_ms=median(quiet) and median(quiet) * 1e3,
                predicted_ms=predicted * 1e3,
                foreign=statistics.median(t[1] for t in ts),
                chosen=c == chosen,
            )
        )
    auto_ts = times[-1]
    return dict(
        model=shape.name,
        batch=shape.batch,
        rows=rows,
        chosen=name_of(chosen),
        rank=rank,
        plans=len(plans),
        best=name_of(plans[best][0]),
        best_ms=grid_medians[best] * 1e3,
        chosen_ms=grid_medians[ci] * 1e3,
        auto_ms=medians[-1] * 1e3,
        ratio=statistics.median(paired),
        quiet_pairs=len(quiet_paired),
        quiet_ratio=median(quiet_paired),
        predicted_ms=plan.chosen.step_s * 1e3,
        planning_s=planning_s,
        measuring_s=plan.measuring_s,
        searching_s=plan.searching_s,
        candidates=plan.candidates,
        notes=costs.notes,
        costs=costs_summary(costs),
        foreign=statistics.median(t[1] for ts in times for t in ts),
        auto_vs_hand=statistics.median(u[0] / h[0] for u, h in zip(auto_ts, times[ci])),
    )


def costs_summary(costs) -> str:
    """What plan=auto measured, in brief: per microbatch size the links' summed F, B and W; the fixed
    costs; the transfer and the exchange."""
    sizes = "; ".join(
        f"size {n}: F {sum(costs.at(costs.forward, j, n) for j in range(len(costs.links))) * 1e3:.2f} "
        f"B {sum(costs.at(costs.input_grad, j, n) for j in range(len(costs.links))) * 1e3:.2f} "
        f"W {sum(costs.at(costs.weight_grad, j, n) for j in range(len(costs.links))) * 1e3:.2f} ms"
        for n in costs.sizes
    )
    return (
        f"{len(costs.links)} links, measured {sizes}; updates {sum(costs.update) * 1e3:.2f} ms; action "
        f"{costs.action_s * 1e3:.3f} ms; step (a call) {costs.step_s * 1e3:.2f} ms; transfer "
        f"{costs.transfer_latency_s * 1e3:.3f} ms + {costs.transfer_s_per_byte * 1e9:.3f} ns/B; exchange "
        f"{costs.exchange_latency_s * 1e3:.3f} ms + {costs.exchange_s_per_byte * 1e9:.3f} ns/B"
    )


def write_findings(a, result: dict) -> None:
    """Append the model's measured (and predicted) step per plan to the findings file (dated lines)."""
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    load = " ".join(open("/proc/loadavg").read().split()[:3])
    lines = [
        f"\n## {stamp} bench_plan.py {result['model']} (batch {result['batch']}, {a.repeats} rounds x {a.steps} "
        f"steps, two single-core workers, {kernel_name()}, load {load}, foreign CPU median "
        f"{result['foreign']:.2f} cores, plan_budget_s {a.plan_budget or 'default'}{', QUICK smoke run: not figures' if a.quick else ''})"
    ]
    for row in result["rows"]:
        q = f"{row['quiet_ms']:.1f}" if row["quiet"] else "-"
        lines.append(
            f"- {stamp} {result['model']} `{row['overrides']}`: measured {row['measured_ms']:.1f} ms "
            f"(quiet {q} ms, {row['quiet']} quiet of {a.repeats}), predicted {row['predicted_ms']:.1f} ms"
            + (" <- plan=auto's choice" if row["chosen"] else "")
        )
    lines.append(
        f"- {stamp} {result['model']}: chosen {result['chosen']} rank {result['rank']}/{result['plans']}, "
        f"best {result['best']} {result['best_ms']:.1f} ms; time(chosen)/time(best) {result['ratio']:.3f}; "
        f"predicted/measured {result['predicted_ms'] / result['chosen_ms']:.3f}; planning "
        f"{result['planning_s']:.1f} s; cost notes: {'; '.join(result['notes']) or 'none'}"
    )
    lines.append(f"- {stamp} {result['model']}: the costs plan=auto measured: {result['costs']}")
    with open(a.findings, "a") as f:
        f.write("\n".join(lines) + "\n")


def print_tables(a, results: list[dict]) -> None:
    load = " ".join(open("/proc/loadavg").read().split()[:3])
    print(
        f"\n{kernel_name()}; two single-core workers; {a.repeats} rounds x {a.steps} steps; load average at the end "
        f"{load}; quiet: other processes below {a.quiet} cores"
    )
    for res in results:
        print(
            f"\n{res['model']} (batch {res['batch']}): plan=auto chose {res['chosen']}, rank {res['rank']} of "
            f"{res['plans']}; best {res['best']}"
        )
        print(
            f"{'plan':34s} {'measured ms':>11s} {'quiet':>5s} {'quiet ms':>8s} {'predicted':>9s} {'pred/meas':>9s} "
            f"{'foreign':>7s}"
        )
        for row in sorted(res["rows"], key=lambda r: r["measured_ms"]):
            q = f"{row['quiet_ms']:8.1f}" if row["quiet"] else f"{'-':>8s}"
            print(
                f"{row['plan'] + (' *' if row['chosen'] else ''):34s} {row['measured_ms']:11.1f} {row['quiet']:5d} {q} "
                f"{row['predicted_ms']:9.1f} {row['predicted_ms'] / row['measured_ms']:9.2f} {row['foreign']:7.2f}"
            )
    print(
        f"\n{'model':10s} {'chosen':30s} {'rank':>6s} {'chosen/best':>11s} {'quiet':>11s} {'pred/meas':>9s} "
        f"{'planning s':>10s} {'auto/hand':>9s}"
    )
    for res in results:
        q = f"{res['quiet_ratio']:.3f} ({res['quiet_pairs']})" if res["quiet_pairs"] else "-"
        print(
            f"{res['model']:10s} {res['chosen']:30s} {res['rank']:>3d}/{res['plans']:<2d} {res['ratio']:11.3f} "
            f"{q:>11s} {res['predicted_ms'] / res['chosen_ms']:9.3f} {res['planning_s']:10.1f} {res['auto_vs_hand']:9.3f}"
        )
    if a.markdown:
        print(
            "\n| model | batch | plans | plan=auto's choice | its rank | best measured | time(chosen) / time(best), "
            "paired | quiet pairs | predicted / measured | planning s (measuring) |"
        )
        print("|---|---|---|---|---|---|---|---|---|---|")
        for res in results:
            q = f"{res['quiet_pairs']} ({res['quiet_ratio']:.2f})" if res["quiet_pairs"] else "0"
            print(
                f"| {res['model']} | {res['batch']} | {res['plans']} | {res['chosen']} | {res['rank']} | {res['best']}, "
                f"{res['best_ms']:.1f} ms | {res['ratio']:.2f} | {q} | {res['predicted_ms'] / res['chosen_ms']:.2f} "
                f"({res['predicted_ms']:.1f} / {res['chosen_ms']:.1f} ms) | {res['planning_s']:.1f} "
                f"({res['measuring_s']:.1f}) |"
            )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", nargs="+", default=["wide", "deep", "transformer"], choices=MODELS)
    p.add_argument("--repeats", type=int, default=5, help="rounds: every plan timed once per round")
    p.add_argument("--steps", type=int, default=3, help="timed steps per measurement")
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--quiet", type=float, default=0.2, help="foreign CPU (cores) below which a measurement is quiet")
    p.add_argument("--small-grid", action="store_true", help="14 plans of the grid (SMALL_GRID) instead of 28")
    p.add_argument("--quick", action="store_true", help="smoke test: tiny models, 4 plans (+ the chosen), 1 round")
    p.add_argument("--findings", default=FINDINGS, help="append each plan's figures here ('' : nowhere)")
    p.add_argument("--plan-budget", type=float, default=None, help="placement.plan_budget_s (default: its default)")
    p.add_argument("--markdown", action="store_true")
    a = p.parse_args()
    if a.quick:
        a.repeats, a.steps, a.warmup = 1, 1, 1
    models = shapes(a.quick)
    results = []
    started = time.time()
    with (
        LocalCluster(2, cpus=[0 % os.cpu_count(), 1 % os.cpu_count()], threads=1) as cluster,
        tempfile.TemporaryDirectory() as scratch,
    ):
        for name in a.models:
            res = bench_model(a, models[name], cluster, scratch)
            results.append(res)
            if a.findings:
                write_findings(a, res)
    print(f"# done in {time.time() - started:.0f} s")
    print_tables(a, results)
    sys.stdout.flush()
    os._exit(0)  # the workers are gone: skip the runtime's teardown RPCs (they only log "Socket closed")


if __name__ == "__main__":
    main()
