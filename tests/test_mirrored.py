"""placement.fallback=mirrored: the chain on every replica computes the pipelined chain's update.

The reference is the same chain trained with every stage on one device (the pipelined
engine, mode=local) on the same global batches; the mirrored run splits each batch over
two logical CPUs of the test session.
"""

import numpy as np
import pytest

import chain
from chain.strategies.mirrored import Mirrored
from compare import assert_same_start, assert_trains_alike, rel_diff, same_batches, weights
from conftest import DEVICES
from graph_audit import audit

TINY = ["+stages=3", "model.depth=1", "model.width=16", "data.batch_size=32", "trainer.progress=false"]
RTOL = 1e-5


def build_pair(*overrides):
    """(mirrored run over CPU:0-1, the same chain pipelined on CPU:2), same initial weights."""
    mirrored = chain.build(chain.compose([*TINY, "placement.fallback=mirrored", *overrides]))
    single = chain.build(
        chain.compose([*TINY, f"placement.devices=[{DEVICES[2]},{DEVICES[2]},{DEVICES[2]}]", *overrides])
    )
    assert_same_start(mirrored, single)
    return mirrored, single


def assert_same_weights(run_a, run_b):
    for a, b in zip(weights(run_a), weights(run_b), strict=True):
        assert rel_diff(a, b) <= RTOL


def test_mirrored_run_holds_every_stage_on_every_replica():
    run = chain.build(chain.compose([*TINY, "placement.fallback=mirrored"]))
    assert isinstance(run.strategy, Mirrored)
    assert run.assignment.mirrored_devices == tuple(DEVICES[:2]) and run.strategy.tf_strategy.num_replicas_in_sync == 2
    assert run.strategy.batch_cut.per_replica == 16
    for s in run.stages:
        assert s.device is None
        # Model, head and every optimizer slot have a copy on both replicas.
        assert s.variable_devices() == DEVICES[:2]


@pytest.mark.parametrize(
    "overrides",
    [
        ["optim=adam"],
        ["optim=sgd"],
        # e2e: the reference is the pipelined chain with 4 microbatches (the same update as
        # the full batch); the mirrored run ignores microbatches.
        ["mode=e2e", "pipeline.microbatches=4"],
    ],
    ids=["local-adam", "local-sgd", "e2e-adam"],
)
def test_mirrored_steps_equal_single_device_training_on_the_same_global_batches(overrides):
    mirrored, single = build_pair(*overrides)
    assert_trains_alike(mirrored, single, same_batches(single, 6), RTOL, moved=100)


def test_mirrored_fit_distributes_the_same_batches():
    """fit() splits each batch of the run's checkpointable `tf.data` iterator over the replicas,
    as `step` does; the result matches too."""
    steps = 5
    mirrored, single = build_pair(f"trainer.steps={steps}")
    summary = mirrored.fit()
    it = iter(single.batches())
    for _ in range(steps):
        last = single.step(*next(it))["stage_losses"]
    assert_same_weights(mirrored, single)
    np.testing.assert_allclose([s["loss_last"] for s in summary["stages"]], last, rtol=RTOL)
    assert summary["mode"] == "local" and summary["strategy"] == "mirrored"
    assert summary["replica_devices"] == DEVICES[:2] and summary["per_replica_batch_size"] == 16


def test_each_replica_computes_on_its_own_device():
    run = chain.build(chain.compose([*TINY, "placement.fallback=mirrored"]))
    x, ys = next(iter(run.batches()))
    a = audit(run.trace(x, ys))
    matmuls = {a.device[op] for op in a.ops() if op.type == "MatMul"}
    assert matmuls == set(DEVICES[:2])


def test_mirrored_batch_must_divide_over_replicas():
    with pytest.raises(chain.ConfigError, match=r"data.batch_size=31 does not divide over 2 replicas"):
        chain.build(chain.compose([*TINY, "placement.fallback=mirrored", "data.batch_size=31"]))


def test_one_process_one_replica_set():
    """A second set of replicas would collide with the first's all-reduce: refused, not crashed."""
    first = chain.build(chain.compose([*TINY, "placement.fallback=mirrored"]))
    again = chain.build(chain.compose([*TINY, "placement.fallback=mirrored", "mode=e2e"]))
    assert again.strategy.tf_strategy is first.strategy.tf_strategy  # rebuilt runs reuse the MirroredStrategy
    assert np.isfinite(again.step(*next(iter(again.batches())))["loss"])
    with pytest.raises(chain.DeviceError, match=r"already trains mirrored runs over /device:CPU:0, /device:CPU:1"):
        chain.build(chain.compose([*TINY, "placement.fallback=mirrored", "placement.replicas=4"]))
