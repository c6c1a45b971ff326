"""Data handed to `Run.step`: checked once, before the compiled step; one ValueError line naming
the argument, the expected and the received shape or dtype. The two silently-wrong cases of
the past (a (B, 1) value target broadcast into a (B, B) loss; float labels truncated) now
train exactly like their correct form, or are refused."""

from __future__ import annotations

import re

import numpy as np
import pytest
import tensorflow as tf

import chain
from chain.data.catalog import Target
from chain.stages import losses
from compare import assert_same_start, weights

SMALL = ["model.width=8", "model.depth=1", "data.batch_size=16", "trainer.progress=false"]
VALUE = [*SMALL, "data=synthetic", "data.features=6", "data.samples=64", "stage.target=value"]


@pytest.fixture(scope="module")
def digits():
    """A 2-stage local chain on digits and one of its batches."""
    run = chain.build(chain.compose([*SMALL, "+stages=2"]))
    return run, next(iter(run.batches()))


@pytest.mark.parametrize(
    "mode", [["mode=e2e", "loss=mse", "pipeline.microbatches=2"], ["mode=local"]], ids=["e2e", "local"]
)
def test_a_value_target_of_shape_b1_trains_exactly_like_b(mode):
    column = chain.build(chain.compose([*VALUE, *mode]))
    flat = chain.build(chain.compose([*VALUE, *mode]))
    assert_same_start(column, flat)
    it = iter(flat.batches())
    for _ in range(3):
        x, ys = next(it)
        y = ys["value"].numpy()
        assert y.shape == (16,)
        got, want = column.step(x, {"value": y[:, None]}), flat.step(x, {"value": y})
        assert got["loss"] == want["loss"]
    for a, b in zip(weights(column), weights(flat)):
        np.testing.assert_array_equal(a, b)


def test_the_value_loss_cannot_broadcast_a_column_against_a_row():
    """The loss itself flattens both sides: the (B, B) broadcast is impossible, not just unlikely."""
    fn = losses.make("mse", Target("value", 0))
    pred, y = tf.constant([[1.0], [2.0], [4.0]]), tf.constant([1.0, 2.0, 3.0])
    assert float(fn(y[:, None], pred)) == float(fn(y, pred)) == pytest.approx(1 / 3)
    onehot = losses.make("mse", Target("label", 3))
    logits, labels = tf.eye(3), tf.constant([0, 1, 2])
    assert float(onehot(labels[:, None], logits)) == float(onehot(labels, logits)) == 0.0


def test_integral_float_labels_train_like_integer_labels():
    ints = chain.build(chain.compose([*SMALL, "+stages=2"]))
    floats = chain.build(chain.compose([*SMALL, "+stages=2"]))
    x, ys = next(iter(ints.batches()))
    label = ys["label"].numpy()
    assert ints.step(x, label)["loss"] == floats.step(x, label.astype(np.float32))["loss"]
    for a, b in zip(weights(ints), weights(floats)):
        np.testing.assert_array_equal(a, b)


CASES = {
    "float label": (
        lambda x, y: (x, y.astype(np.float32) + 0.7),
        r"^y\[0\] = .* is not a class label: target 'label' takes integers 0..9$",
    ),
    "label too large": (
        lambda x, y: (x, np.where(np.arange(len(y)) == 3, 10, y)),
        r"^y\[3\] = 10 is out of range: target 'label' has 10 classes, 0..9$",
    ),
    "negative label": (lambda x, y: (x, np.where(np.arange(len(y)) == 0, -1, y)), r"^y\[0\] = -1 is out of range"),
    "string labels": (lambda x, y: (x, y.astype(str)), r"^y has dtype <U\d+; expected integer class labels$"),
    "empty batch": (lambda x, y: (x[:0], y[:0]), r"^x is empty \(shape \(0, 8, 8, 1\)\)"),
    "wrong feature shape": (
        lambda x, y: (x.reshape(len(x), 64), y),
        r"^x has shape \(16, 64\); data=digits examples have shape \(8, 8, 1\), "
        r"so expected \(N, 8, 8, 1\)$",
    ),
    "wrong label length": (
        lambda x, y: (x, y[:15]),
        r"^y has shape \(15,\); expected \(16,\) or \(16, 1\): one label per example of x",
    ),
    "labels as a matrix": (lambda x, y: (x, np.stack([y, y], 1)), r"^y has shape \(16, 2\); expected"),
    "unknown target key": (
        lambda x, y: (x, {"colour": y}),
        r"^y has a target 'colour', which data=digits does not have; its targets: label, parity$",
    ),
    "string inputs": (lambda x, y: (x.astype(str), y), r"^x has dtype <U\d+; expected numbers"),
}


@pytest.mark.parametrize("case", CASES)
def test_bad_batches_are_refused_before_the_step_with_one_line(digits, case):
    run, (x, ys) = digits
    make, message = CASES[case]
    bad_x, bad_y = make(x.numpy(), ys["label"].numpy())
    before = weights(run)
    with pytest.raises(ValueError) as e:
        run.step(bad_x, bad_y)
    assert "\n" not in str(e.value)
    assert re.search(message, str(e.value)), str(e.value)
    for a, b in zip(before, weights(run)):  # nothing was trained
        np.testing.assert_array_equal(a, b)


def test_a_bare_y_is_refused_when_the_stages_learn_several_targets():
    run = chain.build(chain.compose([*SMALL, "+stages=[{},{target: parity}]"]))
    x, ys = next(iter(run.batches()))
    with pytest.raises(ValueError, match=r"^the stages learn targets 'label', 'parity': pass y as a dict of them$"):
        run.step(x, ys["label"])
    with pytest.raises(ValueError, match=r"^y has no target 'parity', which a stage learns"):
        run.step(x, {"label": ys["label"]})
    assert np.isfinite(run.step(x, ys)["loss"])
