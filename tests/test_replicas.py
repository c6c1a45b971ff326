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
from chain.schedule import schedule_file, schedules
from chain.pipeline.replicas import owners, reduce_mean, stage_state
from compare import rel_diff, trains_like_one_device, weights
from conftest import DEVICES, EXTENDED

LR = 0.1
BASE = [
    "+stages=2",
    "mode=e2e",
    "model.depth=1",
    "model.width=8",
    "optim=sgd",
    f"optim.lr={LR}",
    "data=synthetic",
    "data.features=6",
    "data.classes=4",
    "data.samples=256",
    "data.batch_size=16",
    "trainer.progress=false",
    "checkpoint.export=false",
]
GRID = (tuple(DEVICES[:2]), tuple(DEVICES[2:]))


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


def assert_copies_identical(run, grid=GRID) -> None:
    """Every copy's state (weights, optimizer, counters, loss scale) equals replica 0's, bit for bit,
    and lives on its own device of the grid."""
    copies = run.strategy.copies
    assert tuple(tuple(s.device for s in c) for c in copies) == grid
    for copy in copies[1:]:
        for a, b in zip(copies[0], copy):
            assert b.variable_devices() == [b.device]
            for va, vb in zip(stage_state(a), stage_state(b), strict=True):
                np.testing.assert_array_equal(np.asarray(va.numpy()), np.asarray(vb.numpy()))


CASES = [(s, m, 2 if (s, m) == ("1f1b", 2) else 1) for s in ("gpipe", "1f1b") for m in (1, 2, 4)]  # one with grad_accum


# The suite's time: gpipe at M=1 and M=4 and 1f1b at M=2 with accumulation run every time.
EXTENDED_CASES = {("1f1b", 4, 1), ("gpipe", 2, 1), ("1f1b", 1, 1)}


@pytest.mark.parametrize(
    "schedule, m, accum", [pytest.param(*c, marks=EXTENDED if c in EXTENDED_CASES else ()) for c in CASES]
)
def test_two_copies_of_a_two_stage_pipeline_train_like_one_keras_model_on_the_whole_batch(schedule, m, accum):
    run = build(
        "placement.replicas=2",
        f"pipeline.schedule={schedule}",
        f"pipeline.microbatches={m}",
        f"trainer.grad_accum={accum}",
    )
    assert run.strategy.assignment.copies == GRID and run.strategy.batch_divisor() == 2 * m * accum
    trains_like_one_device(run, one_device_copy(run), DEVICES[0], steps=2, lr=LR)
    assert_copies_identical(run)


SHARED = ((DEVICES[0], DEVICES[1]) * 2, (DEVICES[2], DEVICES[3]) * 2)  # 4 stages, 2 on each device, per copy


def test_copies_of_a_pipeline_from_a_schedule_file_whose_rows_hold_two_stages_train_like_one_keras_model(tmp_path):
    """pipeline.schedule=file with interleaved rows (two stages each): every copy's 4 stages loop over its
    own 2 devices. (pipeline.virtual_stages with copies: tests/test_clipping.py, `interleaved-copies`.)"""
    path = tmp_path / "interleaved.csv"
    schedule_file.write(schedules.interleaved(4, 2, 2), str(path))
    run = chain.build(
        chain.compose(
            [o for o in BASE if o != "+stages=2"]
            + [
                "+stages=4",
                "placement.replicas=2",
                "pipeline.schedule=file",
                f"pipeline.schedule_file={path}",
                "pipeline.microbatches=2",
            ]
        )
    )
    assert run.strategy.assignment.copies == SHARED and run.schedule.devices == 2
    trains_like_one_device(run, one_device_copy(run), DEVICES[0], steps=2, lr=LR)
    assert_copies_identical(run, SHARED)


@EXTENDED  # the suite's time: copies train like one copy every time above; float16's loss scale in test_precision
def test_float16_copies_train_like_one_copy_with_as_many_microbatches():
    """precision=mixed_float16: two copies of one microbatch each equal one copy of two microbatches
    (whose float16 training test_precision holds to Keras); loss scales stay identical."""
    runs = [build("precision=mixed_float16", *o) for o in (["placement.replicas=2"], ["pipeline.microbatches=2"])]
    start = weights(runs[1])
    it = iter(runs[1].batches())
    for _ in range(2):
        x, ys = next(it)
        got, want = (r.step(x, ys) for r in runs)
        np.testing.assert_allclose(got["loss"], want["loss"], rtol=1e-6)
    for a, b, b0 in zip(weights(runs[0]), weights(runs[1]), start, strict=True):
        assert rel_diff(a, b) <= 1e-5 and rel_diff(b, b0) > 1e-3
    assert_copies_identical(runs[0])


def fit_steps(run_dir, steps: int, *overrides):
    run = build(f"trainer.steps={steps}", "checkpoint.every=2", *overrides, run_dir=str(run_dir))
    run.fit()
    return run


def test_a_run_resumes_with_another_number_of_copies(tmp_path):
    """Checkpoints hold one copy of each stage: 2 steps on one copy, resumed on two, end where 4 steps
    on two copies end (float rounding of the split batch apart), and both copies hold the restored state."""
    whole = fit_steps(tmp_path / "whole", 4, "placement.replicas=2")
    fit_steps(tmp_path / "resumed", 2, "placement.replicas=1")
    resumed = fit_steps(tmp_path / "resumed", 4, "placement.replicas=2", "resume=true")
    assert resumed.global_step == 4
    start = weights(build())
    for a, b, b0 in zip(weights(resumed), weights(whole), start, strict=True):
        assert rel_diff(a, b) <= 1e-5 and rel_diff(b, b0) > 1e-3
    assert_copies_identical(resumed)


@pytest.mark.parametrize(
    "overrides, message",
    [
        (
            ["mode=local", "placement.replicas=2"],
            "placement.replicas=2 copies a pipeline, which needs mode=e2e (is local)",
        ),
        (
            ["placement.replicas=2", "pipeline.microbatches=4", "data.batch_size=12"],
            "data.batch_size=12 does not cut into 2 replicas' shares (placement.replicas) of pipeline.microbatches=4 "
            "equal microbatches: use a multiple of 8, e.g. data.batch_size=8",
        ),
        (["placement.replicas=2", "placement.devices=[/CPU:0,/CPU:1]"], "remove placement.devices"),
        (["placement.replicas=two"], "placement.replicas='two' must be an integer or auto"),
        (
            ["placement.exchange_dtype=bfloat16"],
            "placement.exchange_dtype=bfloat16 is the dtype copies of a pipeline "
            "exchange their gradients in, and this run has none",
        ),
        (["placement.replicas=2", "placement.exchange_dtype=float16"], "placement.exchange_dtype"),
    ],
)
def test_replicas_that_cannot_work_are_one_config_line(overrides, message):
    with pytest.raises(ConfigError) as e:
        chain.compose([*BASE, *overrides])
    assert message in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize("replicas", [2, 3])
def test_owners_share_a_stages_sums_evenly_by_bytes(replicas):
    """`reduction="owner"`: 8 Dense layers' gradients (kernel, bias, kernel, ...) of one stage: every
    copy sums as many kernels as any other (give or take one), not copy 0 every kernel."""
    sizes = [1024 * 1024, 1024] * 8
    owned = owners(sizes, replicas)
    kernels = [sum(1 for j in range(0, len(sizes), 2) if owned[j] == r) for r in range(replicas)]
    assert max(kernels) - min(kernels) <= 1 and sum(kernels) == 8, kernels
    assert owners(sizes, replicas) == owned  # the same on every trace: each copy's step agrees


def values_on_three_devices(seed: int, shape: tuple[int, ...]) -> list[tf.Tensor]:
    """A random float32 value on each of the first three logical devices (what three copies reduce)."""
    rng = np.random.default_rng(seed)
    values = []
    for d in DEVICES[:3]:
        with tf.device(d):
            values.append(tf.constant(rng.normal(size=shape).astype(np.float32)))
    return values


def test_an_owner_copys_reduction_gives_every_copy_the_bits_every_copy_summing_gives():
    """`reduce_mean(..., owner=o)` (one sum, the mean sent back) against every device summing all R."""
    values = values_on_three_devices(0, (64, 33))
    every = reduce_mean(values, DEVICES[:3], "t")
    assert all(t.device.endswith(d) for t, d in zip(every, DEVICES[:3]))
    for owner in range(3):
        got = reduce_mean(values, DEVICES[:3], f"t{owner}", owner)
        assert all(t.device.endswith(d) for t, d in zip(got, DEVICES[:3]))
        for a, b in zip(got, every, strict=True):
            np.testing.assert_array_equal(a.numpy(), b.numpy())
    np.testing.assert_allclose(every[0].numpy(), np.mean([v.numpy() for v in values], axis=0), rtol=1e-6, atol=1e-7)


def test_copies_exchanging_bfloat16_gradients_stay_identical_and_train_close_to_float32():
    """placement.exchange_dtype=bfloat16: every copy adds the same rounded values, so the copies stay
    identical bit for bit; the result is the float32 exchange's within bfloat16's rounding, not equal."""
    runs = {
        d: build("placement.replicas=2", "pipeline.microbatches=2", f"placement.exchange_dtype={d}")
        for d in ("float32", "bfloat16")
    }
    it = iter(runs["float32"].batches())
    start = weights(runs["float32"])
    for _ in range(4):
        x, ys = next(it)
        for r in runs.values():
            r.step(x, ys)
    assert_copies_identical(runs["bfloat16"])
    exact, rounded = weights(runs["float32"]), weights(runs["bfloat16"])
    assert any(not np.array_equal(a, b) for a, b in zip(exact, rounded))
    for a, b, a0 in zip(exact, rounded, start, strict=True):
        # bfloat16 keeps 8 significant bits (unit roundoff 2^-9): the updates, not the weights, differ by that share.
        assert np.max(np.abs(b - a)) <= 2.0**-8 * np.max(np.abs(a - a0)) + 1e-7


def test_a_bfloat16_exchange_rounds_each_value_once_and_every_copy_gets_the_same_bits():
    values = values_on_three_devices(1, (16, 9))
    want = np.mean([tf.cast(tf.cast(v, tf.bfloat16), tf.float32).numpy() for v in values], axis=0)
    every = reduce_mean(values, DEVICES[:3], "b", travel=tf.bfloat16)
    for t, d in zip(every, DEVICES[:3]):
        assert t.dtype == tf.float32 and t.device.endswith(d)
        np.testing.assert_array_equal(t.numpy(), every[0].numpy())
    np.testing.assert_allclose(every[0].numpy(), want, rtol=1e-6, atol=1e-7)
    owned = reduce_mean(values, DEVICES[:3], "bo", owner=1, travel=tf.bfloat16)
    for t in owned:  # the owner's mean is rounded for its trip back, and for the owner itself
        np.testing.assert_array_equal(t.numpy(), tf.cast(tf.cast(every[0], tf.bfloat16), tf.float32).numpy())
