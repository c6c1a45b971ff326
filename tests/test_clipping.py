"""optim.clip_global_norm / optim.clip_norm: a cut chain clips exactly as one Keras optimizer with
`global_clipnorm` / `clipnorm` clips the whole model on one device: the norm is over every
stage's gradients (not each stage's own), after float16 unscaling, after the mirrored
all-reduce, on the accumulated gradient."""

from __future__ import annotations

import glob
import os

import keras
import numpy as np
import pytest
import tensorflow as tf

import chain
from chain.errors import ConfigError
from chain.training import compiled_clipping
from compare import rel_diff
from conftest import DEVICES, EXTENDED
from graph_audit import audit

LR = 0.1
CLIP = 0.1  # well below the gradients' global norm here (about 0.5 to 1): every step clips
BASE = [
    "+stages=3",
    "mode=e2e",
    "model.depth=1",
    "model.width=8",
    "model.activation=tanh",
    "optim=sgd",
    f"optim.lr={LR}",
    "data=synthetic",
    "data.features=6",
    "data.classes=4",
    "data.samples=256",
    "data.batch_size=16",
    "trainer.progress=false",
]
STEPS = 3


def keras_reference(run, optimizer: keras.optimizers.Optimizer):
    """One `keras.Sequential` on one device holding copies of the chain's layers (dtype policies
    included) and weights, trained by `optimizer`: `step(x, y) -> (loss, global norm of the true
    gradients)`."""
    with tf.device(DEVICES[3]):
        sources = [layer for s in run.stages for layer in s.model.layers]
        layers = []
        for layer in sources:
            cfg = layer.get_config()
            cfg.pop("name")
            layers.append(type(layer).from_config(cfg))
        model = keras.Sequential([keras.Input(run.dataset.input_shape)] + layers)
        for layer, source in zip(layers, sources):
            layer.set_weights(source.get_weights())
        optimizer.build(model.trainable_variables)
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    scale = getattr(optimizer, "dynamic_scale", None)

    @tf.function
    def step(x, y):
        with tf.device(DEVICES[3]):
            with tf.GradientTape() as tape:
                loss = loss_fn(y, model(x, training=True))
                scaled = loss if scale is None else optimizer.scale_loss(loss)
            grads = tape.gradient(scaled, model.trainable_variables)
            true = grads if scale is None else [g / scale for g in grads]
            norm = tf.linalg.global_norm(true)
            optimizer.apply(grads, model.trainable_variables)
        return loss, norm

    return model, step


def assert_trains_like(run, model, ref_step, steps: int = STEPS, rtol: float = 1e-5) -> list[float]:
    """`steps` steps of the chain and the reference on the same batches: losses, reported global
    norms and final weights within `rtol`; returns the norms."""
    start = [v.numpy() for v in model.trainable_variables]
    it = iter(run.batches())
    norms = []
    for _ in range(steps):
        x, ys = next(it)
        out = run.step(x, ys)
        loss, norm = ref_step(x, ys["label"])
        np.testing.assert_allclose(out["loss"], float(loss), rtol=rtol)
        np.testing.assert_allclose(out["grad_norm"], float(norm), rtol=rtol)
        norms.append(out["grad_norm"])
    chained = [v for s in run.stages for v in s.model.trainable_variables]
    assert len(chained) == len(model.trainable_variables)
    for w, r, w0 in zip(chained, model.trainable_variables, start, strict=True):
        assert rel_diff(w.numpy(), r.numpy()) <= rtol, r.path
        assert rel_diff(r.numpy(), w0) > 100 * rtol  # trained: equality is not trivial
    return norms


INTERLEAVED = [o for o in BASE if o != "+stages=3"] + ["+stages=4", "pipeline.virtual_stages=2"]  # 2 per device
ZBV = [o for o in BASE if o != "+stages=3"] + ["+stages=4"]  # a V: stages 0 and 3 on one device, 1 and 2 on the other


@pytest.mark.parametrize(
    "base, overrides",
    [
        (BASE, ["pipeline.schedule=gpipe", "pipeline.microbatches=2"]),
        # the suite's time: gpipe, zbv (split backwards), the interleaved copies and the accumulating mirrored
        # run clip the chain every time
        pytest.param(
            BASE, ["pipeline.schedule=1f1b", "pipeline.microbatches=4", "trainer.grad_accum=2"], marks=EXTENDED
        ),
        pytest.param(BASE, ["pipeline.schedule=sequential", "pipeline.microbatches=2"], marks=EXTENDED),
        pytest.param(BASE, ["pipeline.schedule=zb1", "pipeline.microbatches=4"], marks=EXTENDED),
        pytest.param(INTERLEAVED, ["pipeline.schedule=interleaved", "pipeline.microbatches=2"], marks=EXTENDED),
        (BASE, ["placement.fallback=mirrored", "trainer.grad_accum=2"]),
        (INTERLEAVED, ["pipeline.schedule=interleaved", "pipeline.microbatches=2", "placement.replicas=2"]),
        (ZBV, ["pipeline.schedule=zbv", "pipeline.microbatches=4"]),
    ],
    ids=["gpipe", "1f1b-accum", "sequential", "zb1", "interleaved", "mirrored-accum", "interleaved-copies", "zbv"],
)
def test_clipping_by_the_global_norm_equals_one_keras_optimizer_on_one_device(base, overrides):
    run = chain.build(chain.compose(base + [f"optim.clip_global_norm={CLIP}", *overrides]))
    for s in run.stages:  # the step clips the chain's gradients; a stage's optimizer would see only its own
        assert s.optimizer.global_clipnorm is None
    model, step = keras_reference(run, keras.optimizers.SGD(learning_rate=LR, global_clipnorm=CLIP))
    norms = assert_trains_like(run, model, step)
    assert min(norms) > 2 * CLIP  # clipping triggered in every step
    if run.assignment.copies:  # copies of the pipeline: each clips by the norm of the averaged gradients
        copies = run.strategy.copies
        for copy in copies[1:]:
            for a, b in zip(copies[0], copy):
                for va, vb in zip(a.trainable_variables, b.trainable_variables, strict=True):
                    np.testing.assert_array_equal(va.numpy(), vb.numpy())
    elif run.stages[0].device is not None:  # pipelined: only one scalar per stage crosses, each way
        audited = audit(run.trace(*next(iter(run.batches()))))
        last = run.stages[-1].device
        assert audited.misplaced([s.device for s in run.stages]) == []
        assert all(c.name.split("/")[-1].startswith("copy_to_") for c, _ in audited.crossings())
        copies = {op.name.split("/")[-1]: op for op in audited.copies() if "clip_global_norm" in op.name}
        away = [s.index for s in run.stages if s.device != last]  # stages sharing the last's device send nothing
        assert sorted(copies) == sorted(
            [f"copy_to_squared_sum_s{k}" for k in away] + [f"copy_to_clip_factor_s{k}" for k in away]
        )
        for name, op in copies.items():
            assert op.outputs[0].shape.rank == 0
            assert audited.device[op] == (last if "squared_sum" in name else run.stages[int(name[-1])].device)


@pytest.mark.parametrize(
    "k, overrides", [(3, []), (2, ["pipeline.microbatches=2", "placement.replicas=2"])], ids=["pipeline", "copies"]
)
def test_the_guard_reads_its_verdict_from_the_clipped_norm_and_still_drops_a_non_finite_step(k, overrides):
    """With clipping the guard makes no pass of its own over the gradients (no sum in an update's
    scope: the clip factor, finite exactly when the global norm is, is its verdict), and a NaN
    step is still never applied, on every stage (the norm, and so every factor, is NaN)."""
    base = [f"+stages={k}"] + BASE[1:4] + ["model.activation=linear"] + BASE[5:] + ["trainer.on_nan=skip", *overrides]
    plain, run = (chain.build(chain.compose(base + clip)) for clip in ([], [f"optim.clip_global_norm={CLIP}"]))
    x, ys = next(iter(run.batches()))

    def guard_sums(r):
        return [op.name for op in r.trace(x, ys).graph.get_operations() if op.type == "Sum" and "_update/" in op.name]

    assert guard_sums(plain) and not guard_sums(run)
    stages = [s for copy in run.strategy.copies for s in copy] if run.assignment.copies else run.stages
    assert run.step(x, ys)["skipped"] == []
    before = [v.numpy().copy() for s in stages for v in s.trainable_variables + s.optimizer.variables]
    bad = x.numpy().copy()
    bad[0, 0] = np.nan  # linear stages carry it to the loss, and back into every stage's gradients
    assert run.step(bad, ys)["skipped"] == list(range(k))
    after = [v.numpy() for s in stages for v in s.trainable_variables + s.optimizer.variables]
    assert all(np.array_equal(a, b) for a, b in zip(before, after))  # weights, moments, iteration counts
    assert [int(s.skipped.numpy()) for s in stages] == [1] * len(stages)


def test_float16_clips_the_unscaled_gradients_as_keras_loss_scale_optimizer():
    run = chain.build(
        chain.compose(
            BASE
            + [
                f"optim.clip_global_norm={CLIP}",
                "precision=mixed_float16",
                "pipeline.schedule=1f1b",
                "pipeline.microbatches=1",
            ]
        )
    )
    opt = keras.optimizers.LossScaleOptimizer(keras.optimizers.SGD(learning_rate=LR, global_clipnorm=CLIP))
    model, step = keras_reference(run, opt)
    norms = assert_trains_like(run, model, step)
    assert min(norms) > 2 * CLIP


def test_clip_norm_is_keras_clipnorm_on_every_stages_optimizer():
    """Per variable, so each stage's optimizer applies it exactly as one device's would."""
    run = chain.build(chain.compose(BASE + ["optim.clip_norm=0.05"]))
    assert [(s.optimizer.clipnorm, s.optimizer.global_clipnorm) for s in run.stages] == [(0.05, None)] * 3
    assert run.strategy.report_format.norm is None  # only a global norm is reported


def test_mode_local_clips_each_stage_by_its_own_global_norm():
    """mode=local: each stage (with its head) is a model of its own with its own loss, so Keras'
    own `global_clipnorm` on its optimizer is the one-device meaning."""
    run = chain.build(chain.compose(BASE + ["mode=local", f"optim.clip_global_norm={CLIP}"]))
    assert [s.optimizer.global_clipnorm for s in run.stages] == [CLIP] * 3


def test_fit_records_the_global_norm_in_summary_and_tensorboard(tmp_path):
    run = chain.build(
        chain.compose(
            BASE
            + [
                f"optim.clip_global_norm={CLIP}",
                "trainer.steps=2",
                "data.val_fraction=0",
                "trainer.steps_per_call=1",
                "trainer.log_every=1",
                "checkpoint.export=false",
            ]
        ),
        run_dir=str(tmp_path),
    )
    norms = []
    summary = run.fit(callback=lambda step, out: norms.append(out["grad_norm"]))
    assert len(norms) == 2 and all(n > CLIP for n in norms)
    assert (summary["grad_norm_first"], summary["grad_norm_last"]) == (norms[0], norms[-1])
    tagged = {}
    for path in glob.glob(os.path.join(tmp_path, "tb", "chain", "events*")):
        for e in tf.compat.v1.train.summary_iterator(path):
            for v in e.summary.value:
                if v.tag == "grad_norm":
                    tagged[e.step] = float(tf.make_ndarray(v.tensor))
    assert tagged == pytest.approx({1: norms[0], 2: norms[1]}, rel=1e-6)


@pytest.mark.parametrize(
    "overrides, message",
    [
        (
            ["optim.clip_norm=1", "optim.clip_global_norm=1"],
            "optim.clip_norm=1.0 and optim.clip_global_norm=1.0 are both set; clip each variable's gradient or all of "
            "them by one norm, not both",
        ),
        (
            ["optim.clip_global_norm=1", "+stages=[{},{optim: {clip_global_norm: 2}}]"],
            "stages[1].optim.clip_global_norm=2.0 differs from stages[0]'s 1.0; mode=e2e clips the whole chain's "
            "gradients by one global norm: give every stage the same",
        ),
        (["optim.clip_global_norm=0"], None),
    ],
)
def test_clipping_settings_that_cannot_hold_are_one_line(overrides, message):
    base = [o for o in BASE if not o.startswith("+stages")] if any(o.startswith("+stages") for o in overrides) else BASE
    with pytest.raises(ConfigError) as e:
        chain.compose(base + overrides)
    assert "\n" not in str(e.value)
    if message:
        assert str(e.value) == message
    else:
        assert "optim.clip_global_norm" in str(e.value)


def compiled_mlp(**clips) -> keras.Model:
    """A 3-layer Keras model compiled with an optimizer that clips (`clips`: Keras' arguments)."""
    keras.utils.set_random_seed(5)
    x = keras.Input((6,))
    h = keras.layers.Dense(8, activation="tanh", name="d0")(keras.layers.Dense(8, activation="tanh", name="d1")(x))
    model = keras.Model(x, keras.layers.Dense(4, name="out")(h))
    model.compile(optimizer=keras.optimizers.LossScaleOptimizer(keras.optimizers.SGD(**clips)), loss="mse")
    return model


CUT = [
    "+stages=3",
    "mode=e2e",
    "data=synthetic",
    "data.features=6",
    "data.classes=4",
    "data.samples=64",
    "data.batch_size=16",
    "trainer.progress=false",
    "optim=sgd",
]


def test_a_compiled_models_clipping_is_kept_with_a_note_in_a_file_and_in_python(tmp_path):
    """Before, the chain dropped a compiled model's optimizer, its clipping with it, without a word."""
    path = str(tmp_path / "clipped.keras")
    compiled_mlp(global_clipnorm=0.25).save(path)
    run = chain.build(chain.compose(CUT + ["model=keras", f"model.path={path}"]))
    assert [s.spec.optim.clip_global_norm for s in run.stages] == [0.25] * 3
    assert run.strategy.clip_global_norm == 0.25 and run.strategy.report_format.norm is not None  # clipped, reported
    assert (
        f"{path} was compiled with global_clipnorm=0.25: the chain clips as optim.clip_global_norm=0.25 "
        "(set optim.clip_norm or optim.clip_global_norm to choose otherwise)" in run.notes
    )
    settings, notes = compiled_clipping.adopt(run.settings, {"clipnorm": 0.125}, "m")  # the config's clipping wins
    assert settings == run.settings and notes == [
        "m was compiled with clipnorm=0.125: the config's optim.clip_* apply instead"
    ]
    settings, notes = compiled_clipping.adopt(
        run.settings, compiled_clipping.of_model(compiled_mlp(clipvalue=3.0)), "m"
    )
    assert settings == run.settings  # nothing to adopt, but not silently dropped either
    assert notes == [
        "m was compiled with clipvalue=3.0: not applied (the chain clips by norm only: optim.clip_norm, "
        "optim.clip_global_norm)"
    ]
