"""placement.plan=auto end to end: the chosen plan trains bit for bit like its overrides written by
hand and like one device within 1e-5; on devices with memory limits it picks only plans the estimate
says fit, and refuses in one line when none does; the run directory's cache spares a resume the
measuring; the command line runs it. (The search on synthetic costs: tests/test_auto_plan_search.py.)"""

from __future__ import annotations

import json
import os
import re
from dataclasses import replace

import keras
import numpy as np
import pytest

import chain
from chain.autoplan import cache, choice, measure, search, settle, table
from chain.errors import ConfigError
from chain.planning.inventory import Inventory
from chain.prepared import prepare
from chain.records import serial
from chain.records.auto_plan import Costs
from chain.training import build as building
from compare import trains_like_one_device, weights
from conftest import DEVICES, read_summary, run_cli

L = keras.layers
BASE = [
    "mode=e2e",
    "optim=sgd",
    "optim.lr=0.1",
    "data=synthetic",
    "data.features=6",
    "data.classes=4",
    "data.samples=256",
    "data.batch_size=16",
    "trainer.progress=false",
    "checkpoint.export=false",
    "placement.plan=auto",
]


def small_model() -> keras.Model:
    keras.utils.set_random_seed(7)
    x = keras.Input((6,))
    h = L.Dense(8, activation="relu", name="a")(x)
    h = L.Dense(8, activation="relu", name="b")(h)
    h = L.Dense(8, activation="relu", name="c")(h)
    return keras.Model(x, L.Dense(4, name="out")(h), name="small")


def applied(overrides, **kw):
    """The spec `chain.build` plans before choosing: prepared, its placement applied."""
    spec = prepare(chain.compose([*BASE, *overrides]))
    return replace(spec, assignment=building.apply(spec))


def two_physical(monkeypatch) -> list[str]:
    """plan=auto's pool made two logical devices taken as two physical ones (the crossing's timing made
    nothing): the pool."""
    pool = DEVICES[:2]
    monkeypatch.setattr(settle, "_pool", lambda spec: (pool, {pool[0]: "A", pool[1]: "B"}))
    monkeypatch.setattr(measure, "_crossing", lambda *a: 0.0)
    return pool


def assert_bit_identical(a, b, steps: int = 3) -> None:
    it = iter(a.batches())
    for _ in range(steps):
        x, ys = next(it)
        assert a.step(x, ys)["loss"] == b.step(x, ys)["loss"]
    for u, v in zip(weights(a), weights(b), strict=True):
        np.testing.assert_array_equal(u, v)


def test_a_cut_model_measured_trains_bit_for_bit_like_its_overrides_by_hand_and_like_one_device(tmp_path):
    spec = settle.settle(applied(["+stages=2"]), str(tmp_path), small_model())
    plan = spec.auto_plan
    assert plan is not None and plan.chosen is plan.ranked[0] and not plan.cached
    assert plan.measuring_s > 0 and os.path.isfile(tmp_path / settle.CACHE)
    overrides = plan.chosen.candidate.overrides()
    auto = chain.build(spec, model=small_model())
    hand = chain.build(chain.compose([*BASE[:-1], *overrides]), model=small_model())
    assert len(auto.stages) == len(hand.stages) == plan.chosen.candidate.stages
    assert_bit_identical(auto, hand)
    # the build path itself (chain.build on the config) chooses the same from the cache and trains alike
    again = chain.build(chain.compose([*BASE, "+stages=2"]), str(tmp_path), model=small_model())
    fresh = chain.build(chain.compose([*BASE[:-1], *overrides]), model=small_model())
    assert_bit_identical(again, fresh)
    trains_like_one_device(chain.build(spec, model=small_model()), small_model(), DEVICES[3])


def forced_costs(pool, physical=None) -> Costs:
    """Two heavy links on devices each its own physical device: copies of the pipeline pay off."""
    rows = ((1e-3, 8e-3),) * 2
    return Costs(
        links=((0, 1), (1, 2)),
        sizes=(2, 16),
        forward=rows,
        input_grad=rows,
        weight_grad=rows,
        update=(1e-5, 1e-5),
        crossing=(8, 4),
        params=(56, 36),
        action_s=1e-5,
        update_s=1e-5,
        step_s=1e-5,
        transfer_s_per_byte=1e-9,
        transfer_latency_s=1e-5,
        exchange_s_per_byte=1e-9,
        exchange_latency_s=1e-5,
        devices=tuple(pool),
        physical=tuple(physical or pool),
        fixed_cut=True,
        measuring_s=0.5,
    )


def test_a_chosen_plan_with_copies_trains_bit_for_bit_like_it_by_hand_and_like_one_device(tmp_path, monkeypatch):
    monkeypatch.setattr(settle, "_measure", lambda s, spec, pool, physical, c: forced_costs(pool))
    base = ["+stages=2", "model.depth=1", "model.width=8"]
    spec = settle.settle(applied(base), str(tmp_path))
    c = spec.auto_plan.chosen.candidate
    assert c.replicas > 1 and spec.assignment.copies  # copies of the pipeline on the four devices
    auto = chain.build(spec)
    hand = chain.build(chain.compose([*BASE[:-1], *base, *c.overrides()]))
    assert_bit_identical(auto, hand)
    run = chain.build(spec)
    with keras.device(DEVICES[0]):
        reference = keras.Sequential(
            [
                keras.Input((6,)),
                *[
                    layer.__class__.from_config({k: v for k, v in layer.get_config().items() if k != "name"})
                    for s in run.stages
                    for layer in s.model.layers
                ],
            ]
        )
    for layer, source in zip(reference.layers, [lay for s in run.stages for lay in s.model.layers]):
        layer.set_weights(source.get_weights())
    trains_like_one_device(run, reference, DEVICES[0], steps=2)


def test_the_cache_spares_a_resume_the_measuring(tmp_path, monkeypatch):
    first = settle.settle(applied(["+stages=2", "model.depth=1", "model.width=8"]), str(tmp_path))
    assert not first.auto_plan.cached and first.auto_plan.measuring_s > 0

    def refuse(*a, **k):
        raise AssertionError("measured again")

    monkeypatch.setattr(measure, "measure", refuse)
    again = settle.settle(applied(["+stages=2", "model.depth=1", "model.width=8", "resume=true"]), str(tmp_path))
    assert again.auto_plan.cached and again.auto_plan.measuring_s == 0
    assert again.auto_plan.chosen.candidate == first.auto_plan.chosen.candidate
    with pytest.raises(AssertionError, match="measured again"):  # another directory: measured
        settle.settle(applied(["+stages=2", "model.depth=1", "model.width=8"]), str(tmp_path / "other"))
    (tmp_path / settle.CACHE).write_text('{"sizes": "damaged"')
    with pytest.raises(AssertionError, match="measured again"):  # a damaged cache: measured again
        settle.settle(applied(["+stages=2", "model.depth=1", "model.width=8"]), str(tmp_path))


def test_the_cache_is_read_only_by_a_run_of_the_same_model_batch_and_devices_and_says_whose(tmp_path, monkeypatch):
    """Issue 48: a run of another model in the directory read the earlier model's measurements (the log
    said only "measured by an earlier run"). Now each part of the key that differs is measured again, named."""
    calls = []
    monkeypatch.setattr(settle, "_measure", lambda s, spec, pool, physical, c: calls.append(1) or forced_costs(pool))
    narrow, wide = ["+stages=2", "model.depth=1", "model.width=8"], ["+stages=2", "model.depth=1", "model.width=16"]
    first = settle.settle(applied(narrow), str(tmp_path)).auto_plan
    assert not first.cached and first.cache is None and len(calls) == 1
    narrow_key = written_key(tmp_path)
    other = settle.settle(applied(wide), str(tmp_path)).auto_plan
    assert not other.cached and other.cache.differs == ("model",) and len(calls) == 2
    line = table.planning_line(other)
    assert re.search(
        r"planning: measured in 0\.5 s \(the run directory's plan_costs\.json held measurements that "
        rf"differ in model, key {narrow_key}, measured by the run of [-\d]+ [:\d]+ UTC "
        rf"\(pid {os.getpid()}, mlp\(width=8, depth=1\)\); this run's key {other.cache.key}\)",
        line,
    ), line
    again = settle.settle(applied([*wide, "resume=true", "trainer.steps=9"]), str(tmp_path)).auto_plan
    assert again.cached and again.cache.key == other.cache.key and len(calls) == 2
    assert re.search(
        r"planning: measurements read from the run directory's plan_costs\.json \(measured by the run "
        rf"of .* \(pid {os.getpid()}, mlp\(width=16, depth=1\)\): the same model, batch, devices, "
        rf"settings and versions, key {other.cache.key}\)",
        table.planning_line(again),
    )
    key = cache.read(str(tmp_path / settle.CACHE)).key
    for changed, word in [("data.batch_size=32", "batch"), ("optim.lr=0.2", "settings"), ("model.width=9", "model")]:
        spec = applied([*wide, changed])
        assert cache.differences(key, settle.cost_key(spec, *settle._pool(spec))) == (word,)
    (tmp_path / settle.CACHE).write_text(json.dumps(serial.to_json(forced_costs(DEVICES))))  # an earlier version's
    plan = settle.settle(applied(wide), str(tmp_path)).auto_plan
    assert not plan.cached and "plan_costs.json held none this version reads" in table.planning_line(plan)


def written_key(run_dir) -> str:
    """The digest of the key the run directory's cache holds."""
    return cache.read(str(run_dir / settle.CACHE)).key.digest


def test_two_models_cut_in_one_run_directory_are_each_measured(tmp_path):
    """Issue 48: the second of two `model=keras` models in one run directory read the first's links and failed
    with `KeyError: 8` from chain/stages/cut.py."""
    keras.utils.set_random_seed(3)
    x = keras.Input((6,))
    other = keras.Model(x, L.Dense(4, name="out")(L.Dense(16, activation="relu", name="a")(x)), name="other")
    settle.settle(applied(["+stages=2"]), str(tmp_path), small_model())
    small_key = written_key(tmp_path)
    second = settle.settle(applied(["+stages=2"]), str(tmp_path), other).auto_plan
    assert not second.cached and second.cache.differs == ("model",)
    assert second.cache.their_key == small_key != second.cache.key == written_key(tmp_path)
    assert second.chosen.candidate.stages <= 2 and "measured by the run of" in table.planning_line(second)


def test_a_cut_models_links_add_up_to_the_whole_as_measured_and_share_its_update(monkeypatch):
    """The links' times are scaled to the whole model's at each size (`measure._scales`) and the update
    is the whole's, shared by weights: with made-up timings (a link's pass 1 ms however small, the whole's
    2.5 ms at the smallest size and 3 ms at the others; an update 0.1 ms per thousand weights), the links'
    F+B+W sum to the whole's at every measured size, keep their relative shares, and their updates sum to
    the whole's."""

    def fake_time(self, kind, size, calls, deadline, call_s, repeat=measure.REPEAT):
        whole = self.model.name.startswith("whole")
        return (2.5e-3 if size == 2 else 3e-3) if whole else 1e-3

    def fake_update(model, optimizer, device, call_s):
        return 1e-7 * sum(int(np.prod(v.shape)) for v in model.trainable_variables)

    monkeypatch.setattr(measure._Link, "time", fake_time)
    monkeypatch.setattr(measure, "_update", fake_update)
    monkeypatch.setattr(measure, "_exchange", lambda *a: 0.0)
    two_physical(monkeypatch)  # the links are timed apart (on one physical device, only the whole: the next test)
    spec = applied(["+stages=2"])
    costs = settle.measurement(spec, None, small_model()).costs
    n = len(costs.links)
    assert n == 4 and len(costs.sizes) >= 2
    for i, size in enumerate(costs.sizes):
        passes = [costs.forward[j][i] + costs.input_grad[j][i] + costs.weight_grad[j][i] for j in range(n)]
        assert sum(passes) == pytest.approx(2.5e-3 if size == 2 else 3e-3)
        assert passes == pytest.approx([passes[0]] * n)  # equal links stay equal
    whole_params = sum(int(np.prod(v.shape)) for v in small_model().trainable_variables)
    assert sum(costs.update) == pytest.approx(1e-7 * whole_params)
    assert [u / costs.update[0] for u in costs.update] == pytest.approx([p / costs.params[0] for p in costs.params])
    assert costs.update_s == costs.action_s  # one action per stage's update, not per link


GB = 1 << 30
WIDE = [*BASE, "+stages=2", "model.width=256", "model.depth=2", "data.features=256", "data.batch_size=64", "optim=adam"]


def gpu_spec(limit_mb: int):
    """A machine of one 24 GB card split into 2 logical GPUs of `limit_mb` each (planned, never built)."""
    return prepare(chain.compose([*WIDE, f"placement.memory_limit_mb={limit_mb}"]), Inventory.of(1, 24 * GB))


def gpu_costs(spec) -> Costs:
    pool = [d for d in spec.assignment.devices]
    return replace(forced_costs(pool, ["GPU:0"] * len(pool)), params=(0, 0))


def test_on_devices_with_memory_limits_only_plans_the_estimate_fits_are_chosen():
    free = gpu_spec(20000)
    every = search.candidates(gpu_costs(free), 64, [2])
    peaks = choice.peaks_of(free, gpu_costs(free), choice.stage_range_costs(free.settings, free))
    highest = sorted({max(search.predict(gpu_costs(free), c, b, 64, peaks=peaks).peaks) for c, b in every})
    assert len(highest) > 2
    limit_mb = (highest[len(highest) // 2] >> 20) + 1  # about half the plans fit
    spec = gpu_spec(limit_mb)
    plan = choice.choose(spec, gpu_costs(spec))
    assert plan.dropped_for_memory > 0
    assert choice.predict(spec, gpu_costs(spec), plan.chosen.candidate) == plan.chosen  # a given plan alike
    for p in plan.ranked:
        assert p.fits and max(p.peaks) <= limit_mb << 20
    # the chosen plan, prepared as the user would write it, passes the manual plan's own memory check
    chosen = prepare(
        chain.compose(
            [
                *WIDE,
                f"placement.memory_limit_mb={limit_mb}",
                *plan.chosen.candidate.overrides(),
                "placement.plan=manual",
            ]
        ),
        Inventory.of(1, 24 * GB),
    )
    assert max(f.total for f in chosen.assignment.footprints) <= limit_mb << 20


def test_when_nothing_fits_plan_auto_refuses_in_one_line_naming_the_shortfall():
    spec = gpu_spec(2)
    with pytest.raises(ConfigError) as e:
        choice.choose(spec, gpu_costs(spec))
    text = str(e.value)
    assert "\n" not in text
    assert "no plan fits" in text and "on /device:GPU:" in text and " more than its " in text
    assert "data.batch_size" in text and "more devices" in text


def gpt_config(tmp_path) -> list[str]:
    """A tiny `model=gpt` on a text file's bytes, planned by plan=auto (a batch of 2: at most 2 microbatches or
    copies, so whichever plan the timings choose is quick to build and train)."""
    text = tmp_path / "corpus.txt"
    text.write_text("the quick brown fox jumps over the lazy dog\n" * 40)
    return [
        "model=gpt",
        "model.width=8",
        "model.depth=2",
        "model.heads=2",
        "data=text",
        f"data.path={text}",
        "data.seq_len=8",
        "data.batch_size=2",
        "data.val_fraction=0",
        "mode=e2e",
        "optim=sgd",
        "optim.lr=0.1",
        "trainer.progress=false",
        "checkpoint.export=false",
        "placement.plan_budget_s=0.05",
        "placement.plan=auto",
    ]


def test_model_gpt_is_planned_on_token_ids_and_trains_bit_for_bit_like_its_plan_by_hand(tmp_path):
    """Issue 51: `model=gpt ... placement.plan=auto` ended `placement.plan=auto times links on float examples,
    and model=gpt takes token ids`. It is now timed on ids of its vocabulary; the plan trains like it by hand."""
    base = gpt_config(tmp_path)
    spec = prepare(chain.compose([*base, "+stages=2"]))
    spec = settle.settle(replace(spec, assignment=building.apply(spec)), str(tmp_path))
    plan = spec.auto_plan
    assert len(cache.read(str(tmp_path / settle.CACHE)).costs.links) > 2  # cut between its blocks
    assert " ".join(plan.chosen.candidate.overrides()[:2]) in table.render(plan)
    auto = chain.build(spec)
    hand = chain.build(chain.compose([*base[:-1], *plan.chosen.candidate.overrides()]))
    assert len(auto.stages) == plan.chosen.candidate.stages
    assert_bit_identical(auto, hand, steps=2)


def embedded_model(seq: int = 6, vocab: int = 20) -> keras.Model:
    """A user's model of integer ids: an Embedding first (its padding 0 masked: its graph carries the mask to
    the average), a per-position Dense, the masked average, the logits."""
    keras.utils.set_random_seed(9)
    ids = keras.Input((seq,), dtype="int32")
    h = L.Embedding(vocab, 8, mask_zero=True, name="embed")(ids)
    h = L.Dense(8, activation="tanh", name="ff")(h)
    return keras.Model(ids, L.Dense(4, name="logits")(L.GlobalAveragePooling1D(name="pool")(h)), name="embedded")


def test_a_users_integer_input_model_with_a_mask_across_its_cuts_is_planned_and_trains_like_it_by_hand(
    tmp_path, monkeypatch
):
    """Before: `placement.plan=auto times links that take one tensor, but embedded ... carries a Keras mask
    across its cuts`. Its ids (data=npz, int32, no vocabulary) are drawn within its Embedding's (two devices
    taken as two physical ones: each link's F, B and W, and the copies' exchange, timed on them)."""
    two_physical(monkeypatch)
    rng = np.random.default_rng(0)
    np.savez(tmp_path / "ids.npz", x=rng.integers(0, 20, (64, 6)).astype("int32"), y=rng.integers(0, 4, 64))
    data = ["data=npz", f"data.path={tmp_path / 'ids.npz'}", "data.y=y", "data.batch_size=16", "data.val_fraction=0"]
    base = [*data, *(o for o in BASE if not o.startswith("data"))]  # placement.plan=auto last
    spec = prepare(chain.compose([*base, "+stages=2"]))
    spec = settle.settle(replace(spec, assignment=building.apply(spec)), str(tmp_path), embedded_model())
    costs = cache.read(str(tmp_path / settle.CACHE)).costs
    # mode=e2e's cuts: before ff and pool the mask Keras recorded crosses too (its values counted)
    assert [tuple(p) for p in costs.links] == [(0, 1), (1, 2), (2, 3), (3, 4)]
    assert list(costs.crossing) == [60, 60, 8, 4]
    auto = chain.build(spec, model=embedded_model())
    hand = chain.build(
        chain.compose([*base[:-1], *spec.auto_plan.chosen.candidate.overrides()]), model=embedded_model()
    )
    assert_bit_identical(auto, hand, steps=2)


def test_examples_are_what_each_link_takes():
    """`chain.stages.examples`: ids within the vocabulary (also floats an Embedding reads), keras_hub's
    padding_mask of ones and segment_ids of zeros, a mask true, the open length the data's."""
    from chain.stages import examples

    ids = keras.Input((None,), dtype="int32", name="token_ids")
    pad, seg = keras.Input((None,), dtype="int32", name="padding_mask"), keras.Input((None,), name="segment_ids")
    floats = keras.Input((None,), name="floats")
    h = (
        L.Embedding(7, 2)(ids)
        + L.Embedding(7, 2)(floats)
        + keras.ops.expand_dims(keras.ops.cast(pad, "float32") + seg, -1)
    )
    model = keras.Model({"token_ids": ids, "padding_mask": pad, "segment_ids": seg, "floats": floats}, h)
    signature = examples.first(model, examples.Feed((5,), vocab=3))
    made = examples.make(signature, 64, 3)
    assert signature["floats"].ids and signature["padding_mask"].fill == 1 and signature["segment_ids"].fill == 0
    for key in ("token_ids", "floats"):
        assert made[key].shape == (64, 5) and set(np.unique(made[key].numpy())) == {0, 1, 2}
    assert made["token_ids"].dtype == "int32" and made["floats"].dtype == "float32"
    assert np.all(made["padding_mask"].numpy() == 1) and np.all(made["segment_ids"].numpy() == 0)
    (given,) = examples.link_signatures([model], examples.Feed((5,), vocab=3))[1:]
    assert given == examples.Leaf((5, 2), "float32")
    # a link giving a tensor and its mask, and the next taking both: the mask true, only floats differentiated
    x = keras.Input((None,), dtype="int32")
    masking = keras.Model(x, [L.Embedding(7, 2)(x), keras.ops.not_equal(x, -1)])
    h, mask = keras.Input((None, 2)), keras.Input((None,), dtype="bool")
    taking = keras.Model([h, mask], L.GlobalAveragePooling1D()(L.Dense(3)(h), mask=mask))
    signatures = examples.link_signatures([masking, taking], examples.Feed((5,), vocab=7))
    assert signatures[1] == [examples.Leaf((5, 2), "float32"), examples.Leaf((5,), "bool", 1)]
    assert examples.values(signatures[1]) == 15 and signatures[2] == examples.Leaf((3,), "float32")
    link = measure._Link(taking, DEVICES[0], signatures[1], signatures[2], 7)
    assert link.time("FBW", 4, 2, 0.0, 0.0) >= 0.0


def test_the_command_line_prints_the_best_plans_of_model_gpt(tmp_path):
    """`placement.plan=auto plan_only=true` for model=gpt: the best candidates' table, and nothing trained."""
    r = run_cli(tmp_path, *gpt_config(tmp_path), "+stages=2", "plan_only=true")
    assert r.returncode == 0, r.stderr
    assert "planning: measured in" in r.stdout and "+stages=" in r.stdout, r.stdout


def test_the_command_line_runs_plan_auto_and_refuses_it_outside_e2e(tmp_path):
    r = run_cli(tmp_path, *BASE, "+stages=2", "trainer.steps=3", "hydra.run.dir=out")
    assert r.returncode == 0, r.stderr
    assert os.path.isfile(tmp_path / "out" / settle.CACHE) and os.path.isfile(tmp_path / "out" / "summary.json")
    stamp = os.stat(tmp_path / "out" / settle.CACHE).st_mtime_ns
    r = run_cli(tmp_path, *BASE, "+stages=2", "trainer.steps=5", "hydra.run.dir=out", "resume=true")
    assert r.returncode == 0, r.stderr  # the same plan again, from the cache: the checkpoint's settings match
    assert read_summary(tmp_path / "out")["resumed_from"] == 3
    whose = read_summary(tmp_path / "out")["plan"]["measured_by"]  # the first run's, with the key both share
    assert re.fullmatch(
        r"the run of [-\d]+ [:\d]+ UTC \(pid \d+, mlp\(width=\d+, depth=\d+\)\), key [0-9a-f]{12}", whose
    )
    assert os.stat(tmp_path / "out" / settle.CACHE).st_mtime_ns == stamp
    r = run_cli(tmp_path, *[o for o in BASE if o != "mode=e2e"], "mode=local", "hydra.run.dir=bad")
    assert r.returncode != 0 and "placement.plan=auto" in r.stderr and "mode=e2e" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize(
    "candidate",
    [
        search.Candidate(2, 2, 2, "1f1b"),
        search.Candidate(1, 4, 4, "interleaved", virtual_stages=2, devices=(DEVICES[0], DEVICES[1]) * 2),
        search.Candidate(1, 3, 2, "zb1", devices=tuple(DEVICES[:3])),
        search.Candidate(1, 2, 4, "gpipe", "always", devices=tuple(DEVICES[:2])),
    ],
)
def test_the_chosen_plans_spec_is_the_one_its_overrides_make(candidate):
    """What plan=auto runs is what `prepare` makes of the user's config with the candidate's overrides."""
    settings = chain.compose([*BASE, "+stages=2"])
    auto = prepare(choice.chosen_settings(settings, candidate))
    hand = prepare(chain.compose([*BASE[:-1], *candidate.overrides()]))
    assert replace(auto.settings, placement=replace(auto.settings.placement, plan="manual")) == hand.settings
    assert replace(auto, settings=None) == replace(hand, settings=None)


def test_on_one_physical_device_the_model_is_timed_once_and_its_links_share_it_by_weights(monkeypatch):
    """Logical devices of one CPU run their actions one at a time: a step is the sum of its actions, so the
    model is timed whole, once per size (a cut model's links and a built-in model's stages are not timed
    apart), and each link takes its share by weights; F, B and W each a third."""
    timed = []

    def fake_time(self, kind, size, calls, deadline, call_s, repeat=measure.REPEAT):
        timed.append((self.model.name, kind))
        return 3e-3

    monkeypatch.setattr(measure._Link, "time", fake_time)
    for measured, whole in (
        (lambda: settle.measurement(applied(["+stages=2"]), None, small_model()), "whole_0"),
        (lambda: settle.measurement(applied(["+stages=3", "model.depth=1", "model.width=8"]), None), "plan_chain"),
    ):
        costs = measured().costs
        assert {name for name, _ in timed} == {whole} and {kind for _, kind in timed} == {"FBW"}
        timed.clear()
        n, total = len(costs.links), sum(costs.params)
        assert n > 1 and any(note.startswith("one physical device") for note in costs.notes)
        for i in range(len(costs.sizes)):
            passes = [costs.forward[j][i] + costs.input_grad[j][i] + costs.weight_grad[j][i] for j in range(n)]
            assert sum(passes) == pytest.approx(3e-3)
            assert passes == pytest.approx([3e-3 * p / total for p in costs.params])
            assert [costs.forward[j][i] for j in range(n)] == pytest.approx([t / 3 for t in passes])


def test_the_copies_exchange_is_timed_as_a_step_runs_it_and_only_between_physical_devices(monkeypatch):
    """With two physical devices in the pool, the copies' exchange is `measure._exchange` of the model's
    links on each (its gradients from the model's own backward), per byte of gradients; on logical
    devices of one physical device nothing crosses (0)."""
    seen = []

    def fake_exchange(copies, devices, size, reduce, fed=None):
        seen.append((copies, list(devices), size, reduce))
        return 4e-3

    monkeypatch.setattr(measure, "_exchange", fake_exchange)
    spec = applied(["+stages=2"])
    same = settle.measurement(spec, None, small_model()).costs
    assert not seen and same.exchange_s_per_byte == 0 and same.exchange_latency_s == 0
    pool = two_physical(monkeypatch)
    costs = settle.measurement(spec, None, small_model()).costs
    [(copies, devices, size, reduce)] = seen
    from chain.pipeline.replicas import reduce_mean

    assert devices == pool and size == min(costs.sizes) and reduce is reduce_mean
    assert [len(c) for c in copies] == [len(costs.links)] * 2  # the model's links on each device
    for chain_, device in zip(copies, pool):
        assert all(v.value.device.endswith(device) for m in chain_ for v in m.trainable_variables)
    assert costs.exchange_s_per_byte == pytest.approx(4e-3 / (4 * sum(costs.params)))
    assert costs.exchange_latency_s == 0


def test_the_exchange_measured_is_what_the_averaging_adds_to_the_step():
    """`measure._exchange` takes the step with the averaging less the step without: an averaging that
    waits 30 ms is measured at about that, the plain one (a tiny model's, on logical devices) far below."""
    import time as clock

    import tensorflow as tf

    from chain.pipeline.replicas import reduce_mean

    def slow(values, devices, name):
        out = reduce_mean(values, devices, name)
        if not name.endswith("_0"):
            return out
        waited = tf.numpy_function(lambda: np.float32(clock.sleep(0.03) or 0), [], tf.float32)
        return [v + tf.cast(waited, v.dtype) for v in out]

    copies = []
    for device in DEVICES[:2]:
        with tf.device(device):
            copies.append([small_model()])
    assert 0.025 <= measure._exchange(copies, DEVICES[:2], 4, slow) < 0.3
    assert measure._exchange(copies, DEVICES[:2], 4, reduce_mean) < 0.015


def test_a_crossing_measured_is_what_moving_the_second_half_adds_over_its_two_crossings():
    """`measure._crossing` times the links with those from the cut on the second device (the twin's)
    less all on the first, halved (a crossing there, its gradient back): a twin whose second half waits
    20 ms more gives about 10 ms; the plain twin (logical devices of one CPU) far less."""
    import time as clock

    import tensorflow as tf

    class Wait(L.Layer):
        def call(self, x):
            waited = tf.numpy_function(lambda: np.float32(clock.sleep(0.02) or 0), [], tf.float32)
            return x + tf.reshape(waited, ())

        def compute_output_shape(self, shape):
            return shape

    def links(device, wait=False):
        with tf.device(device):
            out = [keras.Sequential([keras.Input((6,)), L.Dense(6)]), keras.Sequential([keras.Input((6,)), L.Dense(6)])]
            if wait:
                out[1] = keras.Sequential([keras.Input((6,)), Wait(), L.Dense(6)])
        return out

    own = links(DEVICES[0])
    assert 0.008 <= measure._crossing(own, links(DEVICES[1], wait=True), DEVICES[:2], 4, 1) < 0.05
    assert measure._crossing(own, links(DEVICES[1]), DEVICES[:2], 4, 1) < 0.005


def test_both_timings_take_every_time_from_the_one_clock(monkeypatch):
    """balance=time (`timing.link_times`) and plan=auto (`measure.measure`) time their calls with one timer
    and a call's own cost with one probe (`chain.stages.clock`): with the timer saying 30 ms a call and the probe
    10 ms (nothing is called, so nothing is traced), a link's pass is 20 ms in both, and plan=auto's step cost is
    the probe's."""
    from chain.stages import clock, cut, timing

    monkeypatch.setattr(clock, "seconds", lambda fn, *args: 0.03)
    monkeypatch.setattr(clock, "call_costs", lambda device, x, calls: [0.01] * calls)
    timed = timing.link_times(cut.analyse(small_model(), "small"), DEVICES[:1], {}, 4, progress=False)
    assert timed.times[DEVICES[0]] == pytest.approx([0.02] * len(timed.links))
    models = (
        keras.Sequential([keras.Input((6,)), L.Dense(8)]),
        keras.Sequential([keras.Input((8,)), L.Dense(4)]),
    )
    costs = measure.measure(
        measure.Measuring(
            models=models,
            links=((0, 1), (1, 2)),
            params=(56, 36),
            pool=tuple(DEVICES[:2]),
            physical={d: "CPU:0" for d in DEVICES},
            sizes=(2, 4),
            budget_s=0.0,
            optimizer=lambda: keras.optimizers.SGD(),
            fixed_cut=True,
        )
    )
    assert costs.step_s == 0.01
    for i in range(len(costs.sizes)):  # the model timed whole on one physical device, shared by the links
        passes = (costs.forward, costs.input_grad, costs.weight_grad)
        assert sum(kind[j][i] for kind in passes for j in range(2)) == pytest.approx(0.02)
