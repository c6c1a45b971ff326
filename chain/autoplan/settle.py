"""`placement.plan=auto` in the build: measure the model on the run's devices (or read the run
directory's cache of it), search, and make the chosen plan's `RunSpec` (`chain.autoplan.choice`).

Runs after the user's plan was applied (`chain.training.build.apply`): logical devices are configured
once per process, so the pool the search draws from is the devices that exist then (this machine's
logical devices of the plan's kind, or the cluster workers' devices), and a chosen plan names its
devices among them (`placement.devices`). The measurements are written to RUN_DIR/plan_costs.json
(`chain.records.serial`, atomically) with the key of what they depend on (`chain.autoplan.cache`): a
resume, whose key is the same, reads them and measures nothing; a run of another model, batch, devices,
settings or versions in the directory measures again.
"""

from __future__ import annotations

import importlib.metadata
import math
import os
import time
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Callable, Mapping, Sequence

import keras

from chain.autoplan import cache, choice
from chain.config import Settings
from chain.config.schema import Conv
from chain.planning.footprint import StageCost
from chain.prepared import RunSpec
from chain.records import serial
from chain.records.auto_plan import CacheUse, CostFile, CostKey, Costs, digest

if TYPE_CHECKING:
    from chain.stages.cut import Cuttable

CACHE = cache.NAME


def wanted(spec: RunSpec) -> bool:
    """Whether `spec` asks for plan=auto and has not been planned yet."""
    return choice.is_auto(spec.settings) and spec.auto_plan is None


@dataclass(frozen=True)
class Measurement:
    """What the search reads for a spec: the `Costs` (measured, or the run directory's cache: `cached`),
    what the cache held (`cache`: None, nothing) and, for a cut model, each stage's memory cost by its
    link range (None: a built-in model's, from the config)."""

    costs: Costs
    cached: bool
    stage_cost: Callable[[int, int], StageCost] | None
    cache: CacheUse | None = None


def measurement(spec: RunSpec, run_dir: str | None, model: keras.Model | None = None) -> Measurement:
    """The costs of `spec`'s model on the devices its applied placement has (the pool), from
    RUN_DIR/plan_costs.json when a run there measured them with this run's `CostKey` (the same model,
    batch, devices, settings and versions), else measured now and written there with the key and this run's
    name. `model`: the model `chain.build(cfg, model=...)` was given (else `model.path`'s)."""
    s = spec.settings
    cut_model = model is not None or choice.is_cut_model(s) or choice.is_gpt(s)
    pool, physical = _pool(spec)
    cuttable = None
    if cut_model:
        from chain.stages import cut
        from chain.stages.user_model import gpt_model, load_model

        gpt = model is None and choice.is_gpt(s)
        source = model if model is not None else gpt_model(s) if gpt else load_model(s.stages[0].model)
        cuttable = cut.analyse(source, "model=gpt" if gpt else source.name or "model")
    key = cost_key(spec, pool, physical, cuttable)
    path = os.path.join(run_dir, CACHE) if run_dir else None
    costs, use = cache.lookup(cache.read(path), key) if path else (None, None)
    cached = costs is not None
    if costs is None:
        costs = _measure(s, spec, pool, physical, cuttable)
        if path:
            from chain.state.atomic import write_json

            os.makedirs(run_dir, exist_ok=True)
            label = cuttable.name if model is not None else s.stages[0].model.describe()  # keras(FILE), mlp(...)
            write_json(path, serial.to_json(CostFile(key, _this_run(label), costs)))
    return Measurement(costs, cached, _cut_costs(cuttable, costs) if cuttable is not None else None, use)


def cost_key(
    spec: RunSpec, pool: Sequence[str], physical: Mapping[str, str], cuttable: Cuttable | None = None
) -> CostKey:
    """Everything the measurements of `spec`'s model on `pool` depend on (`chain.autoplan.cache`): a cut
    model's structure (`cuttable`), its links and the vocabulary its ids are drawn from, else the config's stages, their
    targets and the data's shape; the batch and the microbatch sizes measured; the devices; the optimizer and the
    measuring's budget; the libraries' versions."""
    s, info = spec.settings, spec.data_info
    if cuttable is not None:
        from chain.stages.examples import feed

        # its links too: measurements of other links (another version's rule) are not these
        model = digest([cuttable.structure(), feed(s, info, cuttable.layers).vocab, cuttable.points(several=True)])
    else:  # a built-in model is what its stages' settings and the data's shape and targets make of it
        model = digest([repr(st.model) for st in s.stages] + [repr(info.target(s.stages[-1].target))])
    settings = f"optim={s.stages[0].optim!r} placement.plan_budget_s={s.placement.plan_budget_s!r}"
    return CostKey(
        model=model,
        input_shape=tuple(info.input_shape),
        batch_size=s.data.batch_size,
        sizes=tuple(_sizes(s.data.batch_size, len(pool))),
        devices=tuple(pool),
        physical=tuple(physical[d] for d in pool),
        settings=settings,
        tensorflow=_version("tensorflow"),
        keras=keras.version(),
        chain=_version("chain"),
    )


def _version(package: str) -> str:
    """An installed package's version (TensorFlow's as it says itself: its distribution has several names;
    "unknown": not installed as a distribution)."""
    if package == "tensorflow":
        import tensorflow as tf

        return tf.__version__
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def _this_run(model: str) -> str:
    """This run, as a later run's planning line names whose measurements it found: when, which process, what model."""
    return f"the run of {time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime())} (pid {os.getpid()}, {model})"


def settle(spec: RunSpec, run_dir: str | None, model: keras.Model | None = None) -> RunSpec:
    """The chosen plan's `RunSpec` (`RunSpec.auto_plan` set) for a `spec` whose placement was applied
    (`measurement`, then `chain.autoplan.choice.choose` and `chosen_spec`)."""
    m = measurement(spec, run_dir, model)
    plan = choice.choose(spec, m.costs, m.stage_cost)
    plan = replace(plan, measuring_s=0.0 if m.cached else m.costs.measuring_s, cached=m.cached, cache=m.cache)
    return choice.chosen_spec(spec, plan)


def _pool(spec: RunSpec) -> tuple[list[str], dict[str, str]]:
    """The devices plans may use and the physical device behind each: a cluster's, the plan's own;
    else every logical device of the plan's kind that exists (configured once: what the run has)."""
    import tensorflow as tf

    from chain.planning.devices import canonical

    p = spec.assignment
    if p.cluster:  # as `chain.planning.planner.plan_cluster` pools them: the workers' GPUs, else each one's CPU
        from chain.planning import cluster

        tasks = cluster.remote_devices(len(p.cluster))
        gpus = [d for t in tasks for d in t if "/device:GPU:" in d]
        pool = gpus or [next(d for d in t if "/device:CPU:" in d) for t in tasks if t]
        return pool, {d: d for d in pool}  # each worker device computes on its own
    pool = [canonical(d.name) for d in tf.config.list_logical_devices(p.kind)]
    physical = {d: p.physical.get(d, "CPU:0" if p.kind == "CPU" else d) for d in pool}
    return pool, physical


def _sizes(batch: int, pool: int, max_microbatches: int = 64) -> list[int]:
    """Every microbatch size a candidate may run: the batch over R copies and M microbatches."""
    out = set()
    for r in range(1, min(batch, pool) + 1):
        if batch % r == 0:
            share = batch // r
            out.update(share // m for m in range(1, min(share, max_microbatches) + 1) if share % m == 0)
    return sorted(out)


def _measure(s: Settings, spec: RunSpec, pool: list[str], physical: dict[str, str], cuttable) -> Costs:
    """Build the links on the pool's first device and time them (`chain.autoplan.measure`)."""
    from chain.autoplan import measure
    from chain.stages import assemble, examples

    started = time.perf_counter()
    info = spec.data_info
    whole, twin, reduce = None, None, None
    if cuttable is None:
        models, same = _built_in(s, spec, pool[0])
        links = [(k, k + 1) for k in range(len(models))]
        params = [int(sum(v.numpy().size for v in m.trainable_variables)) for m in models]
    else:
        points = cuttable.points(several=True)  # plan=auto is mode=e2e's: a cut may send several tensors
        links = list(zip(points, points[1:]))
        layer_params = cuttable.params()
        params = [sum(layer_params[a:b]) for a, b in links]
        same = None
        models = _cut(cuttable, links, tuple(info.input_shape), pool[0])
        if len(links) > 1:  # the links' times are checked against the whole's
            whole = _cut(cuttable, [(links[0][0], links[-1][1])], tuple(info.input_shape), pool[0], "whole")[0]
    if len(pool) > 1 and physical[pool[0]] != physical[pool[1]]:  # the exchange and a crossing are timed
        from chain.pipeline.replicas import reduce_mean

        reduce = reduce_mean
        twin = (
            _built_in(s, spec, pool[1])[0]
            if cuttable is None
            else _cut(cuttable, links, tuple(info.input_shape), pool[1])
        )
    sizes = _sizes(s.data.batch_size, len(pool))
    budget = max(0.0, s.placement.plan_budget_s - (time.perf_counter() - started))
    costs = measure.measure(
        measure.Measuring(
            models=tuple(models),
            links=tuple(links),
            params=tuple(params),
            pool=tuple(pool),
            physical=physical,
            sizes=tuple(sizes),
            budget_s=budget,
            optimizer=lambda: assemble.make_optimizer(s.stages[0].optim),
            fixed_cut=cuttable is None,
            fed=examples.feed(s, info, cuttable.layers if cuttable is not None else ()),
            same=tuple(same) if same is not None else None,
            whole=whole,
            twin=tuple(twin) if twin is not None else None,
            reduce=reduce,
        )
    )
    return replace(costs, measuring_s=time.perf_counter() - started)


def _built_in(s: Settings, spec: RunSpec, device: str) -> tuple[list[keras.Model], list[int]]:
    """A built-in model's stages on `device`, as `assemble.build_stages` builds them (float32, without
    optimizers), and for each the first stage built alike (the same layers on the same input)."""
    import tensorflow as tf

    from chain.stages import assemble

    info = spec.data_info
    models, shape, same, seen = [], tuple(info.input_shape), [], {}
    with tf.device(device):
        for k, st in enumerate(s.stages):
            # stages built alike are timed once (an mlp flattens its input first: its size is what counts)
            key = (shape if isinstance(st.model, Conv) else math.prod(shape), st.model, k == len(s.stages) - 1)
            same.append(seen.setdefault(key, k))
            m = keras.Sequential([keras.Input(shape), *assemble.model_layers(st.model, shape)], name=f"plan_{k}")
            if k == len(s.stages) - 1:
                for layer in assemble.output_layers(info.target(st.target), tuple(m.output_shape[1:])):
                    m.add(layer)
            models.append(m)
            shape = tuple(m.output_shape[1:])
    return models, same


def _cut(
    cuttable, links: Sequence[tuple[int, int]], shape: tuple[int, ...], device: str, name: str = "plan"
) -> list[keras.Model]:
    """A cut model's `links` (layer ranges) as models on `device`, the first taking `shape`, named
    `name` and their first layer's index."""
    import tensorflow as tf

    from chain.stages.cut import passed, piece

    models = []
    with tf.device(device):
        for a, b in links:
            m = piece(cuttable, a, b, keras.DTypePolicy("float32"))(shape, None, f"{name}_{a}")
            models.append(m)
            shape = passed(m)
    return models


def _cut_costs(c, costs: Costs):
    """A cut model's stage cost by link range, from its layers (as `chain.training.user_bodies` estimates
    a cut): parameters, layer outputs, the tensors crossing its two cuts, its largest layer."""
    params, outputs = c.params(), c.outputs()

    def of(a: int, b: int) -> StageCost:
        lo, hi = costs.links[a][0], costs.links[b - 1][1]
        return StageCost(sum(params[lo:hi]), sum(outputs[lo:hi]), c.crossing(lo), c.crossing(hi), max(params[lo:hi]))

    return of
