"""Every stage's work runs on its own device, by construction, and the graph proves it."""

import numpy as np
import pytest
import tensorflow as tf

import chain
from chain.stages.fused import kind
from conftest import DEVICES
from graph_audit import audit


@pytest.fixture(scope="module")
def run3():
    return chain.build(chain.compose(["+stages=3", "model.depth=1", "model.width=16", "data.batch_size=32"]))


def test_stages_model_and_optimizer_variables_live_on_their_device(run3):
    assert [s.device for s in run3.stages] == DEVICES[:3]
    for s in run3.stages:
        assert s.variable_devices() == [s.device]
        # Every Adam slot sits next to its variable (the lazily built optimizer would not).
        assert len(s.optimizer.variables) > 2 * len(s.trainable_variables)


def test_compiled_step_places_every_op_of_stage_k_on_device_k(run3):
    x, ys = next(iter(run3.batches()))
    a = audit(run3.trace(x, ys))
    assert a.misplaced({s.device for s in run3.stages}) == []
    for s in run3.stages:
        k = f"{s.index:02d}"
        mine = [
            op
            for op in a.ops()
            if a.name(op).split("/")[0].rsplit("_", 1)[0] in (f"stage_{k}", f"head_{k}")
            or a.name(op).startswith(f"optim_{k}")
        ]
        forward = [op for op in mine if op.type == "MatMul"]
        updates = [op for op in mine if op.type.startswith(("Assign", "ResourceApply"))]  # Keras' Adam; the fused one
        assert forward and updates
        assert {a.device[op] for op in mine} == {s.device}
        grads = [op for op in a.ops() if op.name.startswith("gradient_tape") and a.device[op] == s.device]
        assert any(op.type == "MatMul" for op in grads)
    # The only ops that read a tensor from another device are the explicit copies:
    # activations k -> k+1, and each earlier stage's report (loss, guard flag) to the last
    # stage, which returns the step's one report vector. Inputs and labels arrive as copies too.
    crossings = a.crossings()
    assert crossings and all(c.name.startswith("copy_to_") for c, _ in crossings)
    reports = a.report_copies()
    assert {c.name for c in reports} == {f"copy_to_report_s{k}" for k in range(2)}
    assert {a.device[c] for c in reports} == {run3.stages[-1].device}
    assert len([c for c, _ in crossings if c not in reports]) == len(run3.stages) - 1
    assert {c.name for c in a.copies()} == {f"copy_to_stage_{k}" for k in range(3)} | {
        f"copy_to_stage_{k}_target" for k in range(3)
    } | {c.name for c in reports}


def test_audit_catches_the_naive_loop(run3):
    """The hand-written version (model built under tf.device, trained outside it) fails the audit."""
    s0, s1 = run3.stages[:2]

    @tf.function
    def naive(x):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(s1.model(s0.model(x)))
        grads = tape.gradient(loss, s1.model.trainable_variables)
        s1.optimizer.apply_gradients(zip(grads, s1.model.trainable_variables))
        return loss

    x, _ = next(iter(run3.batches()))
    a = audit(naive.get_concrete_function(x))
    unplaced = [op for op in a.ops() if a.device[op] is None and op.type == "MatMul"]
    assert unplaced, "forward ops outside any device scope must be visible to the audit"


def test_step_trains_and_returns_losses(run3):
    it = iter(run3.batches())
    x, ys = next(it)
    before = [w.numpy().copy() for w in run3.stages[2].model.weights]
    out = run3.step(x, ys["label"])
    assert set(out) >= {"loss", "stage_losses"} and len(out["stage_losses"]) == 3
    assert np.isfinite(out["loss"])
    after = [w.numpy() for w in run3.stages[2].model.weights]
    assert any(not np.array_equal(b, c) for b, c in zip(before, after))


def test_device_override_shares_a_device_when_asked():
    run = chain.build(chain.compose(["+stages=3", "placement.devices=[/CPU:0,/CPU:0,/CPU:1]", "model.depth=1"]))
    assert [s.device for s in run.stages] == [DEVICES[0], DEVICES[0], DEVICES[1]]
    assert [s.variable_devices() for s in run.stages] == [[DEVICES[0]], [DEVICES[0]], [DEVICES[1]]]


def test_heterogeneous_chain_builds_and_trains():
    run = chain.build(
        chain.compose(
            [
                "+stages=[{model: {name: conv, filters: 4}},{model: {width: 8, depth: 1}},{model: {width: 4, depth: 3}, optim: sgd, target: parity}]",
                "data.batch_size=16",
            ]
        )
    )
    assert [kind(s.optimizer) for s in run.stages] == ["Adam", "Adam", "SGD"]
    assert run.stages[0].model.output_shape == (None, 8, 8, 4)
    assert run.stages[1].model.output_shape == (None, 8)
    assert run.stages[2].target.name == "parity"
    x, ys = next(iter(run.batches()))
    assert np.isfinite(run.step(x, ys)["loss"])


@pytest.mark.parametrize(
    "devices, message",
    [
        ("[/CPU:0,/CPU:9]", "placement.devices[1]='/CPU:9' does not exist; available:"),
        ("[/CPU:0]", "placement.devices has 1 entry, but there are 2 stages"),
        ("[/CPU:0,garbage]", "placement.devices[1]"),
    ],
)
def test_bad_devices_are_refused(devices, message):
    with pytest.raises(chain.ChainError) as e:
        chain.build(chain.compose([f"placement.devices={devices}"]))
    assert message in str(e.value)
