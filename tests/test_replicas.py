"""Copies of the pipeline (`placement.replicas=R`, mode=e2e): R=2 copies of a K=2 chain on the
session's 4 logical CPUs train exactly like one Keras model on one device on the whole batch
(every schedule, M in {1, 2, 4}, grad_accum, float16), the copies stay identical, and a
checkpoint holds one copy of each stage, so a run resumes with another R."""

from __future__ import annotations

import keras
import numpy as np
import pytest
import tensorflow as tf

import chain
from chain.errors import ConfigError
from chain.pipeline.replicas import stage_state
from compare import rel_diff, trains_like_one_device, weights
from conftest import DEVICES

LR = 0.1
BASE = ["+stages=2", "mode=e2e", "model.depth=1", "model.width=8", "optim=sgd", f"optim.lr={LR}",
        "data=synthetic", "data.features=6", "data.classes=4", "data.samples=256", "data.batch_size=16",
        "trainer.progress=false", "checkpoint.export=false"]
GRID = [DEVICES[:2], DEVICES[2:]]


def build(*overrides, run_dir=None):
    return chain.build(chain.compose([*BASE, *overrides]), run_dir=run_dir)


def one_device_copy(run) -> keras.Model:
    """One `keras.Sequential` on one device with copies of the chain's layers and current weights."""
    with tf.device(DEVICES[0]):
        layers = []
        for s in run.stages:
            for layer in s.model.layers:
                cfg = layer.get_config()
                cfg.pop("name")
                layers.append(layer.__class__.from_config(cfg))
        model = keras.Sequential([keras.Input(run.dataset.input_shape)] + layers)
        for layer, source in zip(layers, [lay for s in run.stages for lay in s.model.layers]):
            layer.set_weights(source.get_weights())
    return model


def assert_copies_identical(run) -> None:
    """Every copy's state (weights, optimizer, counters, loss scale) equals replica 0's, bit for bit,
    and lives on its own device of the grid."""
    copies = run.strategy.copies
    assert [[s.device for s in c] for c in copies] == GRID
    for copy in copies[1:]:
        for a, b in zip(copies[0], copy):
            assert b.variable_devices() == [b.device]
            for va, vb in zip(stage_state(a), stage_state(b), strict=True):
                np.testing.assert_array_equal(np.asarray(va.numpy()), np.asarray(vb.numpy()))


CASES = [(s, m, 1) for s in ("gpipe", "1f1b") for m in (1, 2, 4)] + [("1f1b", 2, 2)]


@pytest.mark.parametrize("schedule, m, accum", CASES)
def test_two_copies_of_a_two_stage_pipeline_train_like_one_keras_model_on_the_whole_batch(schedule, m, accum):
    run = build("placement.replicas=2", f"pipeline.schedule={schedule}", f"pipeline.microbatches={m}",
                f"trainer.grad_accum={accum}")
    assert run.strategy.placement.grid == GRID and run.strategy.batch_divisor() == 2 * m * accum
    trains_like_one_device(run, one_device_copy(run), DEVICES[0], steps=2, lr=LR)
    assert_copies_identical(run)
