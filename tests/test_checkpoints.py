"""Checkpoints in-process: per-stage isolation, all-or-nothing manifest, refusals, exports, the NaN guard."""

import json
import os

import keras
import numpy as np
import pytest
import tensorflow as tf

import chain
from chain.state import manifest
from chain.steps.update import apply_update
from chain.steps.numerics import NonFiniteError

SMALL = ["model.width=8", "model.dropout=0.25", "data.batch_size=16", "trainer.progress=false"]


def fit(run_dir, *overrides):
    run = chain.build(chain.compose([*SMALL, *overrides]), run_dir=str(run_dir))
    run.fit()
    return run


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A 3-stage run, checkpointed every step, keeping 2; its directory and the live Run."""
    run_dir = tmp_path_factory.mktemp("trained")
    return run_dir, fit(run_dir, "+stages=3", "trainer.steps=4", "checkpoint.every=1", "checkpoint.keep=2")


def values(variables):
    return [v.numpy().copy() for v in variables]


def test_each_stage_has_its_own_directories_and_restores_its_own_weights(trained):
    run_dir, run = trained
    dirs = [os.path.join(run_dir, f"stage_{k:02d}") for k in range(3)]
    tb = [os.path.join(run_dir, "tb", f"stage_{k:02d}") for k in range(3)]
    assert len(set(dirs + tb)) == 6 and all(os.listdir(d) for d in dirs + tb)
    fresh = chain.build(chain.compose([*SMALL, "+stages=3"]))  # the same init, untrained
    for k, s in enumerate(fresh.stages):
        # Each stage's index file names its own latest checkpoint; restore the stage from it alone.
        latest = tf.train.latest_checkpoint(dirs[k])
        assert latest == os.path.join(dirs[k], "ckpt-4")
        assert not np.array_equal(s.model.weights[-1].numpy(), run.stages[k].model.weights[-1].numpy())
        tf.train.Checkpoint(model=s.model, head=s.head).restore(latest).expect_partial()
        mine = values(s.model.weights + s.head.weights)
        want = values(run.stages[k].model.weights + run.stages[k].head.weights)
        assert all(np.array_equal(a, b) for a, b in zip(mine, want))
        for j, other in enumerate(run.stages):  # and not another stage's, where shapes allow comparing
            if j != k:
                theirs = values(other.model.weights[-2:])
                assert not any(a.shape == b.shape and np.array_equal(a, b) for a, b in zip(mine[-4:-2], theirs))


def test_manifest_names_complete_steps_and_only_those_stay_on_disk(trained):
    run_dir, _ = trained
    m = manifest.read(str(run_dir))
    assert m["step"] == 4 and m["complete"] == [3, 4] and len(m["stages"]) == 3
    for name in [f"stage_{k:02d}" for k in range(3)] + ["data"]:
        files = sorted(os.listdir(os.path.join(run_dir, name)))
        assert {f.split(".")[0] for f in files if f != "checkpoint"} == {"ckpt-3", "ckpt-4"}
        assert m["checkpoints"][name] == f"{name}/ckpt-4"
        index = open(os.path.join(run_dir, name, "checkpoint")).read()
        assert '"ckpt-3"' in index and '"ckpt-4"' in index and '"ckpt-2"' not in index


def test_restore_continues_the_data_stream_and_cleans_a_half_written_save(trained, tmp_path):
    run_dir, run = trained
    # Leftovers of a save killed at step 5: stage_00 finished, stage_01 left a _temp folder.
    for name in ("ckpt-5.index", "ckpt-5.data-00000-of-00001"):
        open(os.path.join(run_dir, "stage_00", name), "w").close()
    os.makedirs(os.path.join(run_dir, "stage_01", "ckpt-5_temp"))
    other = chain.build(chain.compose([*SMALL, "+stages=3"]))
    m = other.restore(str(run_dir))
    assert m["step"] == 4 and other.global_step == 4
    assert not os.path.exists(os.path.join(run_dir, "stage_00", "ckpt-5.index"))
    assert not os.path.exists(os.path.join(run_dir, "stage_01", "ckpt-5_temp"))
    for a, b in zip(other.stages, run.stages):
        assert all(np.array_equal(x, y) for x, y in zip(values(a.optimizer.variables), values(b.optimizer.variables)))
        assert all(np.array_equal(x, y) for x, y in zip(values(a.random_variables()), values(b.random_variables())))
    x_next, _ = next(other.iterator)  # the batch the original run would have drawn next
    x_orig, _ = next(run.iterator)
    assert np.array_equal(x_next.numpy(), x_orig.numpy())


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["+stages=2"], "the checkpoint's 3 stages hold 6 layers, the config's 2 stages 4: a resume on another"),
        (["+stages=4"], "the checkpoint's 3 stages hold 6 layers, the config's 4 stages 8"),
        (
            ["+stages=3", "model.width=16"],
            "at stage 0: variable layers[1] Dense kernel has shape (64, 8) in the checkpoint but (64, 16) in the config",
        ),
        (
            ["+stages=3", "model.depth=3"],
            "at stage 0: layers[5] Dense (kernel (8, 8), bias (8,)) is in the config but not in the checkpoint",
        ),
        (["+stages=3", "optim=sgd"], "at stage 0: the optimizer is Adam in the checkpoint but SGD in the config"),
        (["+stages=3", "data.batch_size=32"], "data.batch_size=16, the config has data.batch_size=32"),
    ],
)
def test_restoring_into_another_chain_is_a_clear_error_and_changes_nothing(trained, overrides, message):
    run_dir, _ = trained
    other = chain.build(chain.compose([*SMALL, *overrides]))
    before = [values(s.model.weights) for s in other.stages]
    with pytest.raises(chain.ChainError) as e:
        other.restore(str(run_dir))
    assert message in str(e.value) and "\n" not in str(e.value)
    after = [values(s.model.weights) for s in other.stages]
    assert all(np.array_equal(a, b) for x, y in zip(before, after) for a, b in zip(x, y))


def test_a_checkpoint_restores_with_optim_fused_switched(trained):
    # The fused update keeps Keras' variables and slots: switching it is not another optimizer.
    run_dir, run = trained
    other = chain.build(chain.compose([*SMALL, "+stages=3", "optim.fused=false"]))  # trained fused (the default)
    assert other.restore(str(run_dir))["step"] == 4
    for mine, theirs in zip(other.stages, run.stages):
        assert (type(mine.optimizer).__name__, type(theirs.optimizer).__name__) == ("Adam", "FusedAdam")
        for a, b in zip(
            values(mine.model.weights + mine.optimizer.variables),
            values(theirs.model.weights + theirs.optimizer.variables),
        ):
            assert np.array_equal(a, b)


def test_a_new_run_refuses_a_directory_that_holds_a_checkpoint(trained):
    run_dir, _ = trained
    with pytest.raises(chain.ChainError, match="already holds a checkpoint at step 4; pass resume=true"):
        fit(run_dir, "+stages=3", "trainer.steps=2")
    assert manifest.read(str(run_dir))["step"] == 4


def test_exported_chain_reproduces_the_chain(trained):
    run_dir, run = trained
    assert json.load(open(os.path.join(run_dir, "summary.json")))["exports"][-1] == "chain.keras"
    x, _ = next(iter(run.batches()))
    want = run.forward(x)
    loaded = keras.models.load_model(os.path.join(run_dir, "chain.keras"))
    assert np.array_equal(loaded.predict(x, verbose=0), want["head_2"].numpy())
    h = x
    for k in range(3):  # each stage file is that stage: feeding one into the next rebuilds the chain
        h = keras.models.load_model(os.path.join(run_dir, f"stage_{k:02d}.keras"))(h, training=False)
        assert np.array_equal(h.numpy(), want[f"body_{k}"].numpy())
        head = keras.models.load_model(os.path.join(run_dir, f"head_{k:02d}.keras"))
        assert np.array_equal(head(h).numpy(), want[f"head_{k}"].numpy())


def test_guard_drops_a_non_finite_update_entirely():
    run = chain.build(chain.compose([*SMALL, "+stages=2"]))
    s = run.stages[1]
    step = tf.function(lambda grads, loss: apply_update(s, grads, loss))
    good = [tf.ones_like(v) for v in s.trainable_variables]
    before = values(s.trainable_variables) + values(s.optimizer.variables)
    for bad_grads, loss in ([good[:-1] + [good[-1] * np.nan], tf.constant(1.0)], [good, tf.constant(np.inf)]):
        with tf.device(s.device):
            assert bool(step(bad_grads, loss))  # dropped
        after = values(s.trainable_variables) + values(s.optimizer.variables)
        assert all(np.array_equal(a, b) for a, b in zip(before, after))  # weights, moments, iteration count
    assert int(s.skipped.numpy()) == 2
    with tf.device(s.device):
        assert not bool(step(good, tf.constant(1.0)))  # applied
    assert int(s.optimizer.iterations.numpy()) == 1 and int(s.skipped.numpy()) == 2


@pytest.mark.parametrize("mode", ["local", "e2e"])
@pytest.mark.parametrize("on_nan", ["stop", "skip"])
def test_a_nan_batch_stops_or_is_skipped_in_every_stage_it_reaches(on_nan, mode):
    # Linear activations carry the NaN forward (ReLU would turn it into 0 for stage 1);
    # in e2e the NaN loss flows back into both stages' gradients.
    run = chain.build(
        chain.compose(
            [
                *SMALL,
                "+stages=2",
                "model.activation=linear",
                f"trainer.on_nan={on_nan}",
                f"mode={mode}",
                "pipeline.microbatches=2",
            ]
        )
    )
    x, ys = next(run.iterator)
    bad = x.numpy().copy()
    bad[0, 0, 0, 0] = np.nan  # one NaN pixel poisons stage 0's output and so stage 1's input
    assert run.step(x, ys)["skipped"] == []
    before = [values(s.trainable_variables + s.optimizer.variables) for s in run.stages]
    if on_nan == "stop":
        with pytest.raises(NonFiniteError, match=r"^stage 0, stage 1: loss or gradients are not finite at step 2"):
            run.step(bad, ys)
    else:
        assert run.step(bad, ys)["skipped"] == [0, 1]
    # Either way the bad update was never applied: weights, moments and iteration counts as before.
    after = [values(s.trainable_variables + s.optimizer.variables) for s in run.stages]
    assert all(np.array_equal(a, b) for x, y in zip(before, after) for a, b in zip(x, y))
    assert [int(s.skipped.numpy()) for s in run.stages] == [1, 1]
    assert [int(s.optimizer.iterations.numpy()) for s in run.stages] == [1, 1]
