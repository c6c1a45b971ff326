"""Re-staging offline (`python -m chain.restage`, a resume on another stage count written into another directory):
the same layers split into another number of stages keep their outputs and state. (mode=e2e's regrouping, in
place, is tests/test_resume_layout.py's.)"""

import os
import shlex

import numpy as np
import pytest

import chain
from chain.state.remap import restage
from conftest import read_summary, run_cli

BASE = ["model.width=8", "model.dropout=0.1", "data.batch_size=16", "trainer.progress=false", "checkpoint.export=false"]
SRC = ["+stages=4", "model.depth=2", *BASE, "trainer.steps=3"]


@pytest.fixture(scope="module")
def src(tmp_path_factory):
    """A trained 4-stage chain of depth 2 (a CLI run, as a user would have it)."""
    cwd = tmp_path_factory.mktemp("restage")
    run_dir = str(cwd / "src")
    r = run_cli(cwd, *SRC, f"hydra.run.dir={run_dir}")
    assert r.returncode == 0, r.stderr
    return run_dir


def restored(run_dir, *overrides):
    run = chain.build(chain.compose([*BASE, *overrides]))
    run.restore(run_dir)
    return run


def same(a, b) -> bool:
    return a.shape == b.shape and np.array_equal(np.asarray(a), np.asarray(b))


def slots_by_weight(stage):
    """{id(weight): [slot values]} for every trainable variable of a stage."""
    opt = stage.optimizer
    index = {id(v): i for i, v in enumerate(opt._trainable_variables)}
    return {
        id(w): [opt._momentums[index[id(w)]].numpy(), opt._velocities[index[id(w)]].numpy()]
        for w in stage.trainable_variables
    }


def check_mapping(coarse, fine, ratio):
    """`fine` has `ratio` stages for each of `coarse`'s: shared boundaries agree exactly."""
    x, _ = next(iter(coarse.batches()))
    a, b = coarse.forward(x), fine.forward(x)
    for k in range(len(coarse.stages)):
        j = (k + 1) * ratio - 1  # the fine stage that ends where coarse stage k ends
        assert same(a[f"body_{k}"], b[f"body_{j}"]), (k, j)
        assert same(a[f"head_{k}"], b[f"head_{j}"]), (k, j)  # kept heads
    # Optimizer state went with the layers: every weight of the coarse chain has the same
    # value, Adam moments and iteration count as its counterpart in the fine chain.
    coarse_w = [(s, w) for s in coarse.stages for layer in s.model.layers for w in layer.weights]
    fine_w = [(s, w) for s in fine.stages for layer in s.model.layers for w in layer.weights]
    assert len(coarse_w) == len(fine_w) > 0
    for (cs, cw), (fs, fw) in zip(coarse_w, fine_w):
        assert same(cw.numpy(), fw.numpy())
        assert all(same(p, q) for p, q in zip(slots_by_weight(cs)[id(cw)], slots_by_weight(fs)[id(fw)]))
        assert int(cs.optimizer.iterations.numpy()) == int(fs.optimizer.iterations.numpy()) == 3
    seeds = lambda run: [v.numpy() for s in run.stages for v in s.random_variables()]  # noqa: E731
    assert len(seeds(coarse)) == len(seeds(fine)) == 8 and all(same(p, q) for p, q in zip(seeds(coarse), seeds(fine)))


def test_restage_4_to_2_from_the_command_line_keeps_outputs_and_training_continues(src, tmp_path):
    dst = str(tmp_path / "two")
    r = run_cli(tmp_path, src, dst, "+stages=2", module="chain.restage")
    assert r.returncode == 0, r.stderr
    assert "stage 1: head of SRC stage 3 kept" in r.stdout and "heads of SRC stages 0, 2 dropped" in r.stdout
    check_mapping(restored(dst, "+stages=2", "model.depth=4"), restored(src, "+stages=4", "model.depth=2"), 2)
    # The printed command, as printed, trains on: SRC had reached its trainer.steps=3, so it asks for 3 more.
    (command,) = [line.split("continue with: ", 1)[1] for line in r.stdout.splitlines() if "continue with: " in line]
    assert shlex.split(command)[-1] == "trainer.steps=6" and command.count("trainer.steps=") == 1
    r = run_cli(tmp_path, *shlex.split(command)[3:])
    assert r.returncode == 0, r.stderr
    s = read_summary(dst)
    assert s["resumed_from"] == 3 and s["steps"] == 6 and len(s["stages"]) == 2
    assert all(np.isfinite(st["loss_last"]) for st in s["stages"])


def test_restage_2_to_4_keeps_outputs_and_training_continues(src, tmp_path):
    two, four = str(tmp_path / "two"), str(tmp_path / "four")
    restage(src, two, ["+stages=2"])
    report = restage(two, four, ["+stages=4"])
    assert report["heads"][0].startswith("stage 0: new head") and report["heads"][1].startswith(
        "stage 1: head of SRC stage 0"
    )
    run4 = restored(four, "+stages=4", "model.depth=2")
    check_mapping(restored(two, "+stages=2", "model.depth=4"), run4, 2)
    # New heads start fresh: not the weights the original 4-stage run had trained there.
    original = restored(src, "+stages=4", "model.depth=2")
    assert not same(run4.stages[0].head.weights[0].numpy(), original.stages[0].head.weights[0].numpy())
    run = chain.build(
        chain.compose([*BASE, "+stages=4", "model.depth=2", "resume=true", "trainer.steps=5"]), run_dir=four
    )
    s = run.fit()
    assert s["resumed_from"] == 3 and s["steps"] == 5 and run.global_step == 5
    assert all(int(st.optimizer.iterations.numpy()) == 5 for st in run.stages)


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["+stages=3"], "cannot split 4 stages of model.depth=2 (8 blocks) evenly into 3 stages"),
        (["+stages=2", "model.depth=3"], "the checkpoint's 4 stages hold 8 layers, the config's 2 stages 6"),
        (["+stages=2", "model.depth=4", "model.width=16"], "stages have model.width=8, the config's model.width=16"),
        (["+stages=2", "data.batch_size=32"], "data.batch_size=16, the config has data.batch_size=32"),
        (["+stages=2", "optim=sgd"], "stages have optim.name='adam', the config's optim.name='sgd'"),
    ],
)
def test_bad_restaging_is_a_clear_error_and_writes_nothing(src, tmp_path, overrides, message):
    dst = str(tmp_path / "dst")
    with pytest.raises(chain.ChainError) as e:
        restage(src, dst, overrides)
    assert message in str(e.value) and "\n" not in str(e.value)
    assert not os.path.exists(os.path.join(dst, "checkpoint.json"))


def test_bad_restaging_from_the_command_line_is_one_line(src, tmp_path):
    dst = str(tmp_path / "dst")
    r = run_cli(tmp_path, src, dst, "+stages=3", module="chain.restage")
    assert r.returncode == 2 and not os.path.exists(dst)
    assert r.stderr.strip() == (
        "error: cannot split 4 stages of model.depth=2 (8 blocks) evenly into 3 stages; "
        "choose a stage count that divides 8, or give the depths with +stages=[...]"
    )


def test_restage_asks_the_strategy_what_a_mode_builds_and_refuses_independent_models(tmp_path):
    """Which heads and read-out a mode's stages have, and whether they form a chain, is the
    mode's strategy's answer (`chain.strategies.objectives.objective`, the objective every way
    of training of the mode is given), not restage's reading of mode strings: mode=side_by_side (every
    model its own head, every model taking the data) has no chain to regroup, and says so in
    one line, writing nothing."""
    from chain.strategies.objectives import objective

    assert [
        (objective(m).heads, objective(m).readout, objective(m).chained) for m in ("local", "e2e", "side_by_side")
    ] == [(True, False, True), (False, True, True), (True, False, False)]
    src, dst = str(tmp_path / "src"), str(tmp_path / "dst")
    r = run_cli(
        tmp_path,
        "mode=side_by_side",
        "+variants=[{name: a},{name: b}]",
        *BASE,
        "trainer.steps=1",
        f"hydra.run.dir={src}",
    )
    assert r.returncode == 0, r.stderr
    r = run_cli(tmp_path, src, dst, module="chain.restage")
    assert r.returncode == 2 and not os.path.exists(dst)
    assert r.stderr.strip() == (
        "error: mode=side_by_side trains independent models, not one chain: restage regroups "
        "the layers of a chain's stages; there is nothing to regroup"
    )


def test_the_continue_command_moves_a_reached_target_and_keeps_one_ahead():
    from chain.state.remap import continuing

    assert continuing(["+stages=2", "trainer.steps=2000"], 1200, 2000) == ["+stages=2", "trainer.steps=2000"]
    assert continuing(["+stages=2", "trainer.steps=300"], 300, 300) == ["+stages=2", "trainer.steps=600"]
    assert continuing(["trainer.epochs=2", "+stages=2"], 90, 90) == ["+stages=2", "trainer.steps=180"]
    # a schedule's end settled from the old target stays (the checkpoint recorded it)
    assert continuing(["+stages=2", "trainer.steps=300"], 300, 300, 300) == [
        "+stages=2",
        "trainer.steps=600",
        "optim.decay_steps=300",
    ]
    assert continuing(["+stages=2"], 400, 400) == ["+stages=2", "trainer.steps=800"]  # the default target
