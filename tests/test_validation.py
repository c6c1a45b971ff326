"""Validation: the chain scored on the whole validation set (each stage's head in mode=local, the
chain in mode=e2e, also mirrored), the metrics in TensorBoard, the log and summary.json, epochs,
the best checkpoint, early stopping, and a bit-exact resume with all of it on."""

from __future__ import annotations

import glob
import logging
import math
import os

import numpy as np
import pytest
import tensorflow as tf

import chain
from conftest import manifest, read_summary, stage_values

SMALL = ["model.width=16", "model.depth=1", "data.batch_size=16", "trainer.progress=false"]


def by_hand(run, readout: str, target: str, loss: str) -> dict[str, float]:
    """The metrics of one read-out computed with NumPy from the chain's own predictions."""
    pred = run.forward(run.dataset.val_x)[readout].numpy().astype(np.float64)
    y = run.dataset.val_y[target]
    if loss == "mse":
        pred = pred.reshape(-1)
        return {"loss": float(np.mean((pred - y) ** 2)), "mae": float(np.mean(np.abs(pred - y)))}
    logp = pred - pred.max(1, keepdims=True)
    logp -= np.log(np.exp(logp).sum(1, keepdims=True))
    return {"loss": float(-np.mean(logp[np.arange(len(y)), y])), "accuracy": float(np.mean(pred.argmax(1) == y))}


@pytest.mark.parametrize(
    "overrides",
    [
        ["+stages=3"],
        [
            "+stages=2",
            "mode=e2e",
            "data=synthetic",
            "data.samples=200",
            "stage.target=value",
            "loss=mse",
            "pipeline.microbatches=2",
        ],
        ["+stages=2", "placement.fallback=mirrored"],
    ],
    ids=["local", "e2e-value", "mirrored"],
)
def test_evaluation_equals_the_chains_predictions_scored_by_hand(overrides):
    run = chain.build(chain.compose([*SMALL, *overrides]))
    it = iter(run.batches())
    for _ in range(3):
        run.step(*next(it))
    ev = run.evaluate()
    assert len(run.dataset.val_x) % 16  # several batches, the last one partial: all summed
    if run.settings.mode == "local":
        want = [by_hand(run, f"head_{s.index}", s.target.name, "ce") for s in run.stages]
        assert ev.chain is None and len(ev.stages) == len(want)
        got = ev.stages
    else:
        want = [by_hand(run, f"body_{len(run.stages) - 1}", "value", "mse")]
        assert ev.stages == [] and set(ev.chain) == {"loss", "mae"}
        got = [ev.chain]
    for g, w in zip(got, want):
        assert g.keys() == w.keys()
        for k in w:
            assert g[k] == pytest.approx(w[k], rel=1e-5), k
    assert ev.loss == pytest.approx(sum(w["loss"] for w in want), rel=1e-5)


def events(directory) -> dict[str, dict[int, float]]:
    """TensorBoard scalars of one writer's directory: tag -> step -> value."""
    out: dict[str, dict[int, float]] = {}
    for path in glob.glob(os.path.join(directory, "events*")):
        for e in tf.compat.v1.train.summary_iterator(path):
            for v in e.summary.value:
                out.setdefault(v.tag, {})[e.step] = float(tf.make_ndarray(v.tensor))
    return out


def test_local_validation_goes_to_each_stages_writer_the_log_and_summary(tmp_path, caplog):
    run = chain.build(
        chain.compose([*SMALL, "+stages=2", "trainer.steps=5", "trainer.eval_every=2"]), run_dir=str(tmp_path)
    )
    with caplog.at_level(logging.INFO, logger="chain"):
        summary = run.fit()
    final = run.evaluate()
    for k, stage in enumerate(summary["stages"]):
        tb = events(tmp_path / "tb" / f"stage_{k:02d}")
        assert sorted(tb["val_loss"]) == sorted(tb["val_accuracy"]) == [2, 4, 5]  # every 2 steps, and the end
        assert stage["val"] == final.stages[k]
        assert stage["val"] == pytest.approx({"loss": tb["val_loss"][5], "accuracy": tb["val_accuracy"][5]})  # float32
    assert "val_loss" not in events(tmp_path / "tb" / "chain")
    assert summary["val"] is None and summary["best_step"] in (2, 4, 5) and not summary["early_stopped"]
    assert (summary["train_examples"], summary["val_examples"]) == (1617, 180)
    line = [r.getMessage() for r in caplog.records if r.getMessage().startswith("step 5  val_loss")]
    assert line == [
        f"step 5  val_loss {final.stages[0]['loss']:.4f}  {final.stages[1]['loss']:.4f}  "
        f"val_accuracy {final.stages[0]['accuracy']:.4f}  {final.stages[1]['accuracy']:.4f}"
    ]


def test_e2e_validation_goes_to_the_chain_writer_and_the_top_level(tmp_path):
    run = chain.build(
        chain.compose(
            [
                *SMALL,
                "+stages=2",
                "mode=e2e",
                "data=synthetic",
                "data.samples=200",
                "stage.target=value",
                "loss=mse",
                "trainer.steps=3",
            ]
        ),
        run_dir=str(tmp_path),
    )
    summary = run.fit()
    tb = events(tmp_path / "tb" / "chain")
    assert summary["val"] == pytest.approx({"loss": tb["val_loss"][3], "mae": tb["val_mae"][3]})  # TensorBoard: float32
    assert all("val" not in stage for stage in summary["stages"])
    assert "val_loss" not in events(tmp_path / "tb" / "stage_00")


def test_epochs_set_the_steps_and_no_validation_is_allowed():
    s = chain.compose(["trainer.epochs=2"])
    assert s.trainer.steps == math.ceil(2 * 1617 / 64)
    run = chain.build(chain.compose([*SMALL, "+stages=2", "trainer.steps=2", "data.val_fraction=0"]))
    summary = run.fit()
    assert run.dataset.val_x is None and run.evaluate() is None
    assert summary["val"] is None and summary["best_step"] is None and "val" not in summary["stages"][0]


def test_an_evaluation_of_no_example_is_one_line_not_a_division_by_zero():
    # What only reading shows (the sources refuse an empty validation file up front): a set that gives nothing.
    run = chain.build(chain.compose([*SMALL, "+stages=2", "trainer.steps=1"]))
    nothing = tf.data.Dataset.from_tensor_slices((run.dataset.val_x, run.dataset.val_y)).take(0).batch(16)
    with pytest.raises(chain.ConfigError) as e:
        run.strategy.evaluate(nothing)
    assert str(e.value) == (
        "the validation set gave no example, so its loss and metrics are undefined; give validation "
        "data that holds examples, or data.val_fraction=0 (no validation)"
    )


def test_a_split_that_would_hold_out_no_example_is_one_line(tmp_path):
    np.savez(tmp_path / "one.npz", x=np.ones((1, 3), "float32"), y=np.zeros(1, "int64"))
    args = [*SMALL, "data=npz", f"data.path={tmp_path}/one.npz", "data.y=y", "data.batch_size=1"]
    with pytest.raises(chain.ConfigError) as e:
        chain.compose(args)
    assert str(e.value) == (
        "data.val_fraction=0.1 (the default) holds out none of the 1 example of data=npz: validation "
        "and training need one each; give more examples, or data.val_fraction=0 (no validation)"
    )
    assert chain.compose([*args, "data.val_fraction=0"]).data.val_fraction == 0


def test_best_checkpoint_and_early_stopping(tmp_path):
    overrides = [
        *SMALL,
        "+stages=2",
        "data.batch_size=32",
        "optim.lr=0.05",
        "trainer.steps=60",
        "trainer.eval_every=2",
        "trainer.early_stop_patience=2",
        "checkpoint.best=true",
    ]
    summary = chain.build(chain.compose(overrides), run_dir=str(tmp_path / "run")).fit()
    # The validation loss (local: the sum of the stages') at every evaluation, from TensorBoard.
    losses = {}
    for k in range(2):
        for step, v in events(tmp_path / "run" / "tb" / f"stage_{k:02d}")["val_loss"].items():
            losses[step] = losses.get(step, 0.0) + v
    best = min(losses, key=losses.get)
    assert summary["early_stopped"] and summary["steps"] < 60
    assert summary["best_step"] == best and summary["steps"] == best + 2 * 2  # two evaluations without improvement
    assert max(losses) == summary["steps"]
    # best/ holds that step's chain: restored into a fresh one, it scores the best loss again.
    best_dir = str(tmp_path / "run" / "best")
    assert manifest(best_dir)["step"] == best and manifest(best_dir)["complete"] == [best]
    fresh = chain.build(chain.compose(overrides))
    fresh.restore(best_dir)
    assert fresh.evaluate().loss == pytest.approx(losses[best], rel=1e-6)
    assert manifest(best_dir)["validation"][str(best)]["best_loss"] == fresh.evaluate().loss


def test_resume_with_a_user_source_and_evaluation_is_bit_exact(tmp_path):
    """An npz source, dropout, evaluations every 2 steps, the best checkpoint: stopped at step 4
    and resumed to 8, the run ends as an uninterrupted one (weights, best checkpoint, best step)."""
    rng = np.random.default_rng(3)
    x = rng.random((80, 6)).astype("float32")
    np.savez(tmp_path / "d.npz", x=x, y=(x.sum(1) > 3).astype("int64"))
    args = [
        *SMALL,
        "+stages=2",
        "model.dropout=0.2",
        "data=npz",
        f"data.path={tmp_path / 'd.npz'}",
        "data.y=y",
        "data.batch_size=8",
        "trainer.eval_every=2",
        "checkpoint.every=2",
        "checkpoint.best=true",
        "trainer.early_stop_patience=3",
        "checkpoint.export=false",
    ]
    straight, resumed = str(tmp_path / "straight"), str(tmp_path / "resumed")
    chain.build(chain.compose([*args, "trainer.steps=8"]), run_dir=straight).fit()
    chain.build(chain.compose([*args, "trainer.steps=4"]), run_dir=resumed).fit()
    tracked = manifest(resumed)["validation"]["4"]
    assert tracked["last_step"] == 4 and tracked["best_step"] in (2, 4)
    chain.build(chain.compose([*args, "trainer.steps=8", "resume=true"]), run_dir=resumed).fit()
    for directory in ("", "best"):
        for k in range(2):
            a = stage_values(os.path.join(straight, directory), f"stage_{k:02d}")
            b = stage_values(os.path.join(resumed, directory), f"stage_{k:02d}")
            assert set(a) == set(b) and any(key.startswith("random/") for key in a)
            for key in a:  # (how often best/ was written differs: the resumed process wrote it again)
                assert np.array_equal(a[key], b[key]) or key.startswith("save_counter"), (directory, k, key)
    s, t = read_summary(straight), read_summary(resumed)
    assert t["resumed_from"] == 4
    assert (t["best_step"], t["steps"], t["stages"][1]["val"]) == (s["best_step"], s["steps"], s["stages"][1]["val"])
    assert manifest(resumed)["validation"] == manifest(straight)["validation"]
