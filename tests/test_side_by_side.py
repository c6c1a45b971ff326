"""mode=side_by_side: independent models on one data stream do not interfere (each trains exactly
as it would alone on the same batches), under both policies; each has its own checkpoint and
TensorBoard directory; resume is bit-exact; out of memory shrinks the batch and goes on."""

from __future__ import annotations

import csv
import json
import os

import numpy as np
import pytest

import chain
from chain.errors import ConfigError, OutOfMemory
from compare import rel_diff
from conftest import DEVICES, EXTENDED, read_summary, run_cli, run_dirs, stage_values

BASE = [
    "mode=side_by_side",
    "model.width=16",
    "model.depth=1",
    "data=synthetic",
    "data.features=6",
    "data.classes=4",
    "data.samples=256",
    "data.batch_size=16",
    "trainer.progress=false",
    "checkpoint.export=false",
]
VARIANTS = (
    "+variants=[{optim.lr: 0.003},{optim.lr: 0.001, model.width: 8, data.batch_size: 8},{optim: sgd, target: parity}]"
)
STEPS = 5


def alone(run, k: int):
    """Variant k as one model trained alone (mode=local, one stage), from its weights in `run`."""
    v = run.settings.variants[k]
    over = [
        f"{'stage.target' if key == 'target' else key}={value}"
        for key, value in v.overrides
        if key != "data.batch_size"
    ]
    single = chain.build(chain.compose([*BASE[1:], "+stages=1", f"placement.devices=[{DEVICES[3]}]", *over]))
    s, mine = single.stages[0], run.stages[k]
    for a, b in zip(s.model.weights + s.head.weights, mine.model.weights + mine.head.weights):
        a.assign(b)
    return single, v.batch_size


# EXTENDED: the suite's time; lockstep runs every time, round_robin's variants equal themselves alone below
@pytest.mark.parametrize("policy", ["lockstep", pytest.param("round_robin", marks=EXTENDED)])
def test_models_side_by_side_train_exactly_as_each_alone(policy):
    run = chain.build(chain.compose([*BASE, VARIANTS, f"side_by_side.policy={policy}"]))
    assert [s.device for s in run.stages] == DEVICES[:3]
    singles = [alone(run, k) for k in range(3)]  # before training: the same initial weights
    initial = [[v.numpy().copy() for v in s.trainable_variables] for s in run.stages]
    it = iter(run.batches())
    for _ in range(STEPS):
        x, ys = next(it)
        out = run.step(x, ys)
        for k, (single, b) in enumerate(singles):
            target = run.stages[k].target.name
            got = single.step(x[:b], {target: ys[target][:b]})
            np.testing.assert_allclose(out["stage_losses"][k], got["loss"], rtol=1e-6)
    for k, (single, _) in enumerate(singles):
        mine, theirs = run.stages[k], single.stages[0]
        for a, b in zip(mine.trainable_variables, theirs.trainable_variables, strict=True):
            assert rel_diff(a.numpy(), b.numpy()) <= 1e-6, (k, a.name)
        assert int(mine.optimizer.iterations.numpy()) == STEPS
        assert max(rel_diff(a.numpy(), b) for a, b in zip(mine.trainable_variables, initial[k])) > 1e-3  # it trained


def test_a_paused_model_is_kept_and_checkpointed_but_not_trained(tmp_path):
    run = chain.build(
        chain.compose([*BASE, "+variants=[{},{name: frozen, paused: true}]", "trainer.steps=3"]), run_dir=str(tmp_path)
    )
    before = [w.numpy().copy() for w in run.stages[1].trainable_variables]
    summary = run.fit()
    assert all(np.array_equal(a, b.numpy()) for a, b in zip(before, run.stages[1].trainable_variables))
    assert summary["stages"][1]["paused"] and summary["stages"][1]["loss_last"] is None
    assert summary["ranking"][-1]["variant"] == "frozen"
    assert os.listdir(tmp_path / "stage_01")  # checkpointed like the others


def test_each_variant_has_its_own_directories_and_resume_is_bit_exact(tmp_path):
    args = [*BASE, VARIANTS, "checkpoint.every=2"]
    straight = chain.build(chain.compose([*args, "trainer.steps=6"]), run_dir=str(tmp_path / "straight"))
    straight.fit()
    chain.build(chain.compose([*args, "trainer.steps=4"]), run_dir=str(tmp_path / "resumed")).fit()
    resumed = chain.build(chain.compose([*args, "trainer.steps=6", "resume=true"]), run_dir=str(tmp_path / "resumed"))
    assert resumed.fit()["resumed_from"] == 4
    for a, b in zip(straight.stages, resumed.stages):
        for x, y in zip(
            a.trainable_variables + list(a.optimizer.variables), b.trainable_variables + list(b.optimizer.variables)
        ):
            np.testing.assert_array_equal(x.numpy(), y.numpy())
    dirs = [tmp_path / "straight" / f"stage_{k:02d}" for k in range(3)]
    tb = [tmp_path / "straight" / "tb" / f"stage_{k:02d}" for k in range(3)]
    assert len({str(d) for d in dirs + tb}) == 6 and all(os.listdir(d) for d in dirs + tb)


def test_out_of_memory_shrinks_the_batch_of_the_models_on_that_device_and_goes_on(tmp_path, monkeypatch):
    """An injected ResourceExhaustedError at step 3 on stage 1's device: only that model's batch
    shrinks (16 -> 13 with oom.shrink=0.85), no model was changed by the failed try (every
    optimizer counts exactly one update per step), and the event is in summary.json."""
    monkeypatch.setenv("CHAIN_TEST_OOM", f"3@{DEVICES[1]}")
    variants = "+variants=[{optim.lr: 0.003},{optim.lr: 0.001}]"
    run = chain.build(chain.compose([*BASE, variants, "trainer.steps=5"]), run_dir=str(tmp_path))
    summary = run.fit()
    assert summary["oom_events"] == [{"step": 3, "device": DEVICES[1], "batch_sizes": {"optim.lr=0.001": [16, 13]}}]
    assert [st["batch_size"] for st in summary["stages"]] == [16, 13]
    assert [int(s.optimizer.iterations.numpy()) for s in run.stages] == [5, 5]
    assert json.load(open(tmp_path / "summary.json"))["oom_events"] == summary["oom_events"]


def test_out_of_memory_below_the_floor_stops_with_one_line(tmp_path):
    run_dir = str(tmp_path / "run")
    r = run_cli(
        tmp_path,
        *BASE,
        "+variants=[{},{optim.lr: 0.01}]",
        "trainer.steps=5",
        "checkpoint.every=2",
        "oom.min_batch_size=14",
        f"hydra.run.dir={run_dir}",
        env={"CHAIN_TEST_OOM": f"3@{DEVICES[1]}"},
    )
    assert r.returncode == OutOfMemory.exit_code
    assert r.stderr.strip() == (
        f"error: out of memory on {DEVICES[1]} at step 3 with the smallest batches allowed: optim.lr=0.01 (16); "
        "shrinking by oom.shrink=0.85 would go below oom.min_batch_size=14; the last complete checkpoint (step 2) "
        "is intact"
    )


def test_a_grid_from_the_command_line_ranks_its_variants(cli, tmp_path):
    r = cli(
        *BASE,
        "+grid={optim.lr: [0.003, 0.0003], model.width: [8, 16]}",
        "trainer.steps=20",
        "checkpoint.export=true",
        "report=true",
    )
    assert r.returncode == 0, r.stderr
    s = read_summary(run_dirs(tmp_path)[0])
    names = [st["variant"] for st in s["stages"]]
    assert names == [
        "optim.lr=0.003,model.width=8",
        "optim.lr=0.003,model.width=16",
        "optim.lr=0.0003,model.width=8",
        "optim.lr=0.0003,model.width=16",
    ]
    values = [r["value"] for r in s["ranking"]]
    assert values == sorted(values) and {r["variant"] for r in s["ranking"]} == set(names)
    assert "rank  variant" in r.stdout and "chain.keras" not in s["exports"]
    # Variants, not stages of a pipeline: the placement table's rows and the layout note say so.
    assert "\nvariant  device " in "\n" + r.stdout and "stage  device" not in r.stdout
    assert "note: topology: side by side (4 independent models, a device per variant)" in r.stdout
    assert "topology: pipeline" not in r.stdout
    with open(os.path.join(run_dirs(tmp_path)[0], "report.html")) as f:
        assert '<table id="placement"><tr><th>variant</th>' in f.read()  # the report's placement table too


@EXTENDED  # the suite's time: a multirun's jobs, each its own process, are compared every time
def test_multirun_runs_each_job_in_its_own_process_even_with_other_stage_counts(cli, tmp_path):
    r = cli("-m", "+stages=1,3", "trainer.steps=2", "trainer.progress=false")
    assert r.returncode == 0, r.stderr
    summaries = sorted((tmp_path / "multirun").glob("*/*/*/summary.json"))
    assert [len(json.load(open(p))["stages"]) for p in summaries] == [1, 3]
    # The sweep ends with a table of its jobs, also written as the sweep directory's jobs.csv.
    (sweep_dir,) = (tmp_path / "multirun").glob("*/*")
    with open(sweep_dir / "jobs.csv") as f:
        jobs = list(csv.DictReader(f))
    assert [(j["job"], j["exit"], j["steps"], j["overrides"]) for j in jobs] == [  # as Hydra passed them on
        ("0", "0", "2", "++stages=1 trainer.steps=2 trainer.progress=False"),
        ("1", "0", "2", "++stages=3 trainer.steps=2 trainer.progress=False"),
    ]
    table = r.stdout[r.stdout.index("job  exit  steps  loss") :].splitlines()
    for job, path, row, k in zip(jobs, summaries, table[1:], (1, 3)):
        s = json.load(open(path))
        assert job["run_dir"] == str(path.parent) and float(job["loss"]) == s["loss_last"]
        assert job["val_loss"] == " / ".join(repr(st["val"]["loss"]) for st in s["stages"])  # each stage's
        assert row.split()[:4] == [job["job"], "0", "2", f"{s['loss_last']:.4g}"]
        assert f" ++stages={k} " in row and "trainer.steps" not in row  # what the jobs differ in
        assert row.endswith(os.path.relpath(path.parent, tmp_path))
    assert f"jobs: {os.path.relpath(sweep_dir / 'jobs.csv', tmp_path)}" in r.stdout
    assert not [p for p in (tmp_path / "multirun").rglob("*") if "%" in p.name]  # no stray .submitit/%j


# --- each variant's result comes from the seed and the variant itself, never from its neighbours ---------
# "The same variant alone": a side-by-side run of that one variant (any data.batch_size: a variant takes the
# first examples of each shared batch of data.batch_size), and, for a variant without its own batch size, a
# plain one-stage mode=local run with its overrides (the same seed, the same batches). Weights, optimizer
# slots, dropout seed state and validation loss are compared bit for bit.
REPRO = ["seed=2", *BASE[1:], "model.dropout=0.2", "trainer.steps=6", "checkpoint.export=false"]
GRID = ["{optim.lr: 0.01}", "{optim.lr: 0.001}", "{model.width: 32, data.batch_size: 8}"]
PLAIN = [["optim.lr=0.01"], ["optim.lr=0.001"], None]  # the last has its own batch: no plain run has its batches


def state(stage) -> list[np.ndarray]:
    """Everything a variant's training produced: weights, head, optimizer variables, dropout seed state."""
    return [
        v.numpy()
        for v in stage.model.weights + stage.head.weights + list(stage.optimizer.variables) + stage.random_variables()
    ]


def fitted(*overrides: str):
    run = chain.build(chain.compose([*REPRO, *overrides]))
    summary = run.fit()
    return [state(s) for s in run.stages], [st["val"]["loss"] for st in summary["stages"]]


@pytest.fixture(scope="module")
def each_alone():
    """Per variant of GRID: (its state, its val loss) trained alone side by side, and in a plain run (or None)."""
    out = []
    for entry, plain in zip(GRID, PLAIN):
        states, losses = fitted("mode=side_by_side", f"+variants=[{entry}]")
        ref = fitted("mode=local", "+stages=1", *plain) if plain else None
        out.append(((states[0], losses[0]), ref and (ref[0][0], ref[1][0])))
    return out


def assert_same(got, want, what):
    (a, la), (b, lb) = got, want
    assert la == lb, (what, la, lb)
    assert len(a) == len(b), what
    for x, y in zip(a, b):
        np.testing.assert_array_equal(x, y, err_msg=what)


@pytest.mark.parametrize(
    "order, policy",
    [
        ([0, 1, 2], "lockstep"),
        # the suite's time: each order and each policy runs every time, in these two of the four
        pytest.param([0, 1, 2], "round_robin", marks=EXTENDED),
        pytest.param([2, 0, 1], "lockstep", marks=EXTENDED),
        ([2, 0, 1], "round_robin"),
    ],
    ids=["order0-lockstep", "order0-round_robin", "order1-lockstep", "order1-round_robin"],
)
def test_a_variant_side_by_side_ends_bit_equal_to_the_same_variant_alone_whatever_its_position(
    each_alone, policy, order
):
    states, losses = fitted(
        "mode=side_by_side", f"side_by_side.policy={policy}", "+variants=[" + ",".join(GRID[k] for k in order) + "]"
    )
    for pos, k in enumerate(order):
        alone_sbs, plain = each_alone[k]
        assert_same((states[pos], losses[pos]), alone_sbs, f"{GRID[k]} at position {pos} vs alone side by side")
        if plain:
            assert_same((states[pos], losses[pos]), plain, f"{GRID[k]} at position {pos} vs a plain run")


def test_a_variant_batch_larger_than_the_shared_batch_is_refused():
    with pytest.raises(
        ConfigError,
        match=r"^variant 'data.batch_size=32': data.batch_size=32 is larger than "
        r"data.batch_size=16, the shared batch",
    ):
        chain.compose([*BASE, "+variants=[{},{data.batch_size: 32}]"])


def test_multirun_jobs_match_the_variants_trained_side_by_side(tmp_path):
    """`-m optim.lr=0.01,0.001` (each job a plain one-stage run in its own process) ends with the
    checkpoints of the two variants trained side by side, bit for bit."""
    common = [*REPRO, "trainer.steps=3"]
    r = run_cli(
        tmp_path, *common, "mode=side_by_side", "+variants=[{optim.lr: 0.01},{optim.lr: 0.001}]", "hydra.run.dir=sbs"
    )
    assert r.returncode == 0, r.stderr
    r = run_cli(tmp_path, "-m", *common, "mode=local", "+stages=1", "optim.lr=0.01,0.001", "hydra.sweep.dir=multi")
    assert r.returncode == 0, r.stderr
    for k in range(2):
        job, mine = (
            stage_values(tmp_path / "multi" / str(k), "stage_00"),
            stage_values(tmp_path / "sbs", f"stage_{k:02d}"),
        )
        assert job.keys() == mine.keys() and len(job) > 4
        for key in job:
            np.testing.assert_array_equal(job[key], mine[key], err_msg=f"job {k}: {key}")
