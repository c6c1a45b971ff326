"""Regularization losses: every stage minimizes and logs its loss plus its models' `model.losses`
(weight and activity regularizers, `add_loss`), as Keras' `fit` does, in every mode.

The oracle is Keras itself: `model.fit` / `train_on_batch` of the same model, from the same
weights, with the same Adam, on the same batches.
"""

from __future__ import annotations

import os

import keras
import numpy as np
import pytest
import tensorflow as tf

import chain
import user_nets
from compare import microbatch_sgd_step, norm_rel_diff, rel_diff
from conftest import EXTENDED, run_cli
from graph_audit import audit

SYNTH = [
    "data=synthetic",
    "data.features=6",
    "data.classes=4",
    "data.samples=256",
    "data.batch_size=16",
    "trainer.progress=false",
    "checkpoint.export=false",
    "optim=adam",
    "optim.lr=0.01",
]
STEPS = 3
RTOL = 1e-5  # as the other equality tests (microbatches and replicas included)


def regularized(kind: str) -> keras.Model:
    """Four Dense layers (cut 2 + 2): `kernel` an L2 kernel regularizer on every layer, `activity`
    an L2 activity regularizer on a layer of each stage (none on the weights), `both`, `none`."""
    keras.utils.set_random_seed(5)
    kernel = keras.regularizers.L2(0.05) if kind in ("kernel", "both") else None

    def activity(on: bool):
        return keras.regularizers.L2(0.02) if kind in ("activity", "both") and on else None

    layers = [
        keras.layers.Dense(8, activation="tanh", kernel_regularizer=kernel, activity_regularizer=activity(i in (1, 2)))
        for i in range(3)
    ]
    return keras.Sequential([keras.Input((6,)), *layers, keras.layers.Dense(4, kernel_regularizer=kernel)], name="reg")


def copy_of(model: keras.Model) -> keras.Model:
    out = keras.models.clone_model(model)
    out.set_weights(model.get_weights())
    return out


def compiled(model: keras.Model, run) -> keras.Model:
    # The stages' own Adam class (the fused kernel by default, `optim.fused`): Keras' fit with it is the oracle.
    model.compile(
        optimizer=type(run.stages[0].optimizer).from_config(run.stages[0].optimizer.get_config()),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        jit_compile=False,
    )
    return model


def keras_stage(s, run) -> tuple[keras.Model, keras.Model]:
    """Stage `s` (mode=local, side_by_side) as Keras models from its current weights: (a copy of
    its body, the body and head as one compiled model)."""
    body, head = copy_of(s.model), copy_of(s.head)
    inp = keras.Input(s.model.inputs[0].shape[1:])
    return body, compiled(keras.Model(inp, head(body(inp))), run)


def take(run, steps: int) -> list:
    it = iter(run.batches())
    return [next(it) for _ in range(steps)]


def assert_moved_alike(got: list, want: list, start: list, rtol: float) -> None:
    for a, b, b0 in zip(got, want, start, strict=True):
        assert rel_diff(a, b) <= rtol
        assert rel_diff(b, b0) > 100 * rtol  # training moved the weights: equality is not trivial


def trains_like_fit(run, reference: keras.Model) -> None:
    """STEPS steps of the chain log the losses and reach the weights of `reference.fit` (one
    epoch over the same batches, unshuffled) within RTOL; the weights moved."""
    start = [w.numpy() for w in reference.trainable_variables]
    batches = take(run, STEPS)
    losses = [float(run.step(x, ys)["loss"]) for x, ys in batches]
    x = np.concatenate([np.asarray(b[0]) for b in batches])
    y = np.concatenate([np.asarray(b[1]["label"]) for b in batches])
    history = compiled(reference, run).fit(x, y, batch_size=len(batches[0][0]), epochs=1, shuffle=False, verbose=0)
    np.testing.assert_allclose(np.mean(losses), history.history["loss"][0], rtol=RTOL)  # fit logs the batches' mean
    chained = [w.numpy() for s in run.stages for w in s.model.trainable_variables]
    assert_moved_alike(chained, [w.numpy() for w in reference.trainable_variables], start, RTOL)


@pytest.mark.parametrize(
    "kind, overrides",
    [
        ("kernel", []),
        # the suite's time: M=4 runs every time (e2e-activity-M4), 1f1b sums the same microbatches in another order
        pytest.param("kernel", ["pipeline.microbatches=4", "pipeline.schedule=1f1b"], marks=EXTENDED),
        # the suite's time: accumulated with regularizers every time in mirrored-activity-accum2 (and in mode=local)
        pytest.param(
            "kernel", ["pipeline.microbatches=2", "pipeline.schedule=gpipe", "trainer.grad_accum=2"], marks=EXTENDED
        ),
        ("activity", ["pipeline.microbatches=4", "pipeline.schedule=gpipe"]),
        ("activity", ["pipeline.microbatches=2", "trainer.jit_compile=true"]),
        ("both", ["pipeline.microbatches=2", "pipeline.schedule=zb1"]),
        ("kernel", ["placement.fallback=mirrored"]),
        ("activity", ["placement.fallback=mirrored", "trainer.grad_accum=2"]),
    ],
    ids=[
        "e2e-M1",
        "e2e-1f1b-M4",
        "e2e-gpipe-M2-accum2",
        "e2e-activity-M4",
        "e2e-activity-xla",
        "e2e-zb1-both",
        "mirrored-e2e",
        "mirrored-activity-accum2",
    ],
)
def test_e2e_trains_like_model_fit_regularizers_included(kind, overrides):
    """mode=e2e (pipelined or mirrored): the logged losses and the weights after 3 Adam steps equal
    `model.fit` of the uncut model on the same batches, whose loss includes `sum(model.losses)`."""
    model = regularized(kind)
    reference = copy_of(model)
    run = chain.build(chain.compose(["+stages=2", "mode=e2e", *SYNTH, *overrides]), model=model)
    trains_like_fit(run, reference)


@pytest.mark.parametrize(
    "kind, overrides",
    [
        ("kernel", []),
        ("activity", ["trainer.grad_accum=2"]),
        # the suite's time: XLA and the mirrored fallback with regularizers run every time in the e2e test above
        pytest.param("activity", ["trainer.jit_compile=true"], marks=EXTENDED),
        pytest.param("kernel", ["placement.fallback=mirrored"], marks=EXTENDED),
    ],
    ids=["local", "local-activity-accum2", "local-activity-xla", "mirrored-local"],
)
def test_local_stages_train_like_train_on_batch_regularizers_included(kind, overrides):
    """mode=local: each stage (its piece of the model and its head) equals Keras' `train_on_batch`
    of that piece and head on the stage's input, loss and regularization included."""
    run = chain.build(chain.compose(["+stages=2", "mode=local", *SYNTH, *overrides]), model=regularized(kind))
    references = [keras_stage(s, run) for s in run.stages]
    start = [w.numpy() for _, m in references for w in m.trainable_variables]
    for x, ys in take(run, STEPS):
        got = run.step(x, ys)["stage_losses"]
        h, want = np.asarray(x), []
        for body, m in references:
            h_next = body(h, training=True).numpy()  # the stage's input: the previous stage before its update
            want.append(m.train_on_batch(h, np.asarray(ys["label"])))
            h = h_next
        np.testing.assert_allclose(got, want, rtol=RTOL)
    chained = [w.numpy() for s in run.stages for w in s.trainable_variables]
    assert_moved_alike(chained, [w.numpy() for _, m in references for w in m.trainable_variables], start, RTOL)


# EXTENDED: the suite's time; lockstep runs every time, and round_robin trains each variant alike (test_side_by_side)
@pytest.mark.parametrize("policy", ["lockstep", pytest.param("round_robin", marks=EXTENDED)])
def test_side_by_side_models_train_like_train_on_batch_regularizers_included(policy):
    """mode=side_by_side: each variant (a builder's layer with an L2 kernel regularizer, and a
    head) equals Keras' `train_on_batch` of the same layers on its slice of the batch."""
    variants = (
        "+variants=[{model._target_: user_nets.regularized},"
        "{model._target_: user_nets.regularized, model.units: 4, data.batch_size: 8}]"
    )
    run = chain.build(chain.compose(["mode=side_by_side", variants, f"side_by_side.policy={policy}", *SYNTH]))
    references = [keras_stage(s, run)[1] for s in run.stages]
    start = [w.numpy() for m in references for w in m.trainable_variables]
    for x, ys in take(run, STEPS):
        got = run.step(x, ys)["stage_losses"]
        want = [
            m.train_on_batch(np.asarray(x)[: v.batch_size], np.asarray(ys["label"])[: v.batch_size])
            for m, v in zip(references, run.settings.variants)
        ]
        np.testing.assert_allclose(got, want, rtol=RTOL)
    chained = [w.numpy() for s in run.stages for w in s.trainable_variables]
    assert_moved_alike(chained, [w.numpy() for m in references for w in m.trainable_variables], start, RTOL)


@pytest.mark.parametrize(
    "overrides",
    # the suite's time: the pipelined run scales every stage's regularization every time, the mirrored
    # fallback's regularization is test_e2e_trains_like_model_fit_regularizers_included's
    [["pipeline.microbatches=2"], pytest.param(["placement.fallback=mirrored"], marks=EXTENDED)],
    ids=["pipelined-M2", "mirrored"],
)
def test_float16_loss_scaling_scales_the_regularization_too(overrides):
    """precision=mixed_float16, mode=e2e: every stage's regularization is inside the scaled loss
    (unscaled with the gradients), so training equals float32 `model.fit` within float16's
    rounding (2u per stage in norm, as in test_precision; u = 2^-11)."""
    u = 2.0**-11
    model = regularized("kernel")
    reference = copy_of(model)
    run = chain.build(
        chain.compose(["+stages=2", "mode=e2e", "precision=mixed_float16", *SYNTH, *overrides]), model=model
    )
    assert all(s.loss_scale is not None for s in run.stages)
    batches = take(run, STEPS)
    losses = [float(run.step(x, ys)["loss"]) for x, ys in batches]
    x = np.concatenate([np.asarray(b[0]) for b in batches])
    y = np.concatenate([np.asarray(b[1]["label"]) for b in batches])
    history = compiled(reference, run).fit(x, y, batch_size=len(batches[0][0]), epochs=1, shuffle=False, verbose=0)
    assert abs(np.mean(losses) - history.history["loss"][0]) <= 2 * u * history.history["loss"][0]
    want, start = reference.trainable_variables, 0
    for s in run.stages:
        n = len(s.model.trainable_variables)
        got = np.concatenate([w.numpy().ravel() for w in s.model.trainable_variables])
        ref = np.concatenate([w.numpy().ravel() for w in want[start : start + n]])
        assert norm_rel_diff(got, ref) <= 2 * u, s.index
        start += n


@pytest.mark.parametrize("mode", ["e2e", "local"])
def test_validation_loss_includes_the_regularization_like_keras_evaluate(mode):
    """The validation loss (what `checkpoint.best` and early stopping follow) is the loss plus the
    regularization of the stages it follows, as Keras' `evaluate` reports it (activity regularizers
    on the validation batch, the weights' terms), batch by batch."""
    model = regularized("both")
    run = chain.build(chain.compose(["+stages=2", f"mode={mode}", *SYNTH]), model=model)
    for x, ys in take(run, 2):
        run.step(x, ys)
    got = run.evaluate()
    val = list(run.validation_batches())
    x = np.concatenate([np.asarray(b[0]) for b in val])
    y = np.concatenate([np.asarray(b[1]["label"]) for b in val])
    size = len(val[0][0])
    if mode == "e2e":
        whole = keras.Sequential([copy_of(s.model) for s in run.stages])
        np.testing.assert_allclose(got.loss, compiled(whole, run).evaluate(x, y, batch_size=size, verbose=0), rtol=RTOL)
        return
    h, want = x, []
    for s in run.stages:
        body, m = keras_stage(s, run)
        want.append(m.evaluate(h, y, batch_size=size, verbose=0))
        h = body(h).numpy()
    np.testing.assert_allclose([st["loss"] for st in got.stages], want, rtol=RTOL)


@pytest.mark.parametrize("kind, noted", [("kernel", "0, 1"), ("activity", "0, 1"), ("none", None)])
def test_the_plan_notes_which_stages_losses_include_regularizers(kind, noted):
    run = chain.build(chain.compose(["+stages=2", "mode=e2e", *SYNTH]), model=regularized(kind))
    # The cut pieces keep their layers' regularizers (before any call: the weights' terms alone).
    assert [len(s.model.losses) for s in run.stages] == ([2, 2] if kind == "kernel" else [0, 0])
    assert [sum(layer.activity_regularizer is not None for layer in s.model.layers) for s in run.stages] == (
        [1, 1] if kind == "activity" else [0, 0]
    )
    notes = [n for n in run.assignment.notes if "regularizers" in n]
    assert notes == (
        [
            f"the loss of stage(s) {noted} includes their regularizers (model.losses), as Keras' fit: "
            "the logged loss is the loss plus these terms"
        ]
        if noted
        else []
    )


def test_regularization_is_computed_on_each_stage_s_device():
    """mode=e2e: every op of the step (the regularizers' included) sits on its stage's device, and
    data crosses devices only through `copy_to`: each stage before the last sums its terms on its
    device and sends one scalar to the last stage, where the chain's loss is reported."""
    run = chain.build(
        chain.compose(["+stages=2", "mode=e2e", "pipeline.microbatches=2", *SYNTH]), model=regularized("activity")
    )
    x, ys = next(iter(run.batches()))
    a = audit(run.trace(x, ys))
    assert a.misplaced({s.device for s in run.stages}) == []
    assert all(c.name.split("/")[-1].startswith("copy_to_") for c, _ in a.crossings())
    assert [a.device[op] for op in a.ops() if op.name.split("/")[-1] == "regularization_s0"] == [run.stages[0].device]
    sent = [op for op in a.copies() if op.name.endswith("copy_to_regularization_s0")]
    assert [a.device[op] for op in sent] == [run.stages[1].device]


ADDED = [user_nets.with_added_loss, user_nets.head]


def test_add_loss_terms_are_part_of_the_loss_like_model_fit():
    """Builders whose layer calls `add_loss` (mode=e2e, one microbatch): the chain equals `model.fit`
    of the same layers in one model."""
    run = chain.build(chain.compose(["mode=e2e", *SYNTH]), stages=ADDED)
    reference = keras.Sequential([copy_of(s.model) for s in run.stages])
    trains_like_fit(run, reference)


@pytest.mark.parametrize(
    "overrides, parts, way_out",
    [
        (
            ["mode=e2e", "pipeline.microbatches=2"],
            "pipeline.microbatches=2 equal microbatches",
            ": use pipeline.add_loss=per_microbatch (each part's terms weighed by its share of the batch), or ",
        ),
        (["mode=local", "trainer.grad_accum=2"], "trainer.grad_accum=2 equal chunks", ": use trainer.grad_accum=1"),
        (
            ["mode=local", "trainer.grad_accum=2", "pipeline.add_loss=per_microbatch"],
            "trainer.grad_accum=2 equal chunks",
            ": pipeline.add_loss=per_microbatch is mode=e2e's pipeline's only, not DevicePerStageLocal's: use trainer.grad_accum=1",
        ),
        (
            ["mode=e2e", "placement.fallback=mirrored", "trainer.grad_accum=2"],
            "trainer.grad_accum=2 equal chunks",
            ": use trainer.grad_accum=1",
        ),
    ],
)
def test_add_loss_terms_on_parts_of_a_batch_are_refused(overrides, parts, way_out):
    """An `add_loss` term computed per microbatch or chunk need not add up to the whole batch's
    (a sum over examples would not): by default (`pipeline.add_loss=exact`), and where the step does not
    weigh each part's terms (not a pipeline), refused in one line naming the stage, the keys and the way out."""
    with pytest.raises(chain.ConfigError) as e:
        chain.build(chain.compose([*SYNTH, *overrides]), stages=ADDED)
    message = str(e.value)
    assert message.startswith("stage 0 (") and "add_loss" in message and parts in message and "\n" not in message
    assert way_out in message


class SquaredBatchMean(keras.layers.Layer):
    """Passes its input through and adds `weight x sum((the batch's mean activation)^2)`: a term over
    the batch as a whole (a mean over examples only inside the square), as an MoE's load-balancing loss."""

    def __init__(self, weight=0.5, **kwargs):
        super().__init__(**kwargs)
        self.weight = weight

    def call(self, x):
        self.add_loss(self.weight * keras.ops.sum(keras.ops.square(keras.ops.mean(x, axis=0))))
        return x


def batch_terms_model() -> keras.Model:
    """Six layers, one term over the batch (`SquaredBatchMean`) and one mean over examples (`MeanSquare`)."""
    keras.utils.set_random_seed(8)
    x = keras.Input((6,))
    h = SquaredBatchMean(name="batch_term")(keras.layers.Dense(8, activation="tanh", name="d0")(x))
    h = user_nets.MeanSquare(name="example_term")(keras.layers.Dense(8, activation="tanh", name="d1")(h))
    return keras.Model(x, keras.layers.Dense(4, name="out")(keras.layers.Dense(8, activation="tanh", name="d2")(h)))


def by_hand(model: keras.Model, x: np.ndarray, y: np.ndarray, m: int) -> tuple[float, float]:
    """The loss in NumPy from `model`'s weights: (per microbatch: each of the `m` parts' cross-entropy and
    terms weighed 1/m, summed; the whole batch's)."""
    w = {layer.name: [v.numpy().astype(np.float64) for v in layer.weights] for layer in model.layers}

    def loss(x, y):
        h0 = np.tanh(x @ w["d0"][0] + w["d0"][1])
        h1 = np.tanh(h0 @ w["d1"][0] + w["d1"][1])
        logits = np.tanh(h1 @ w["d2"][0] + w["d2"][1]) @ w["out"][0] + w["out"][1]
        logits -= logits.max(-1, keepdims=True)
        ce = np.mean(np.log(np.exp(logits).sum(-1)) - logits[np.arange(len(y)), y])
        return ce + 0.5 * np.sum(np.mean(h0, 0) ** 2) + 0.1 * np.mean(h1**2)

    parts = zip(np.split(x.astype(np.float64), m), np.split(y, m))
    return sum(loss(xm, ym) for xm, ym in parts) / m, loss(x.astype(np.float64), y)


PER_MICROBATCH = [
    "mode=e2e",
    "pipeline.microbatches=4",
    "pipeline.add_loss=per_microbatch",
    "optim=sgd",
    "optim.lr=0.5",
    *[o for o in SYNTH if not o.startswith("optim")],
]


@pytest.mark.parametrize(
    "overrides, parts",
    [
        (["pipeline.schedule=gpipe", "+stages=2", "placement.split=[3,3]"], 4),
        # the suite's time: gpipe, zbv and the copies' 1f1b weigh the same microbatches every time
        pytest.param(["pipeline.schedule=1f1b", "+stages=2", "placement.split=[3,3]"], 4, marks=EXTENDED),
        pytest.param(["pipeline.schedule=zb1", "+stages=2", "placement.split=[3,3]"], 4, marks=EXTENDED),
        pytest.param(
            ["pipeline.schedule=interleaved", "pipeline.virtual_stages=2", "+stages=4", "placement.split=[2,2,1,1]"],
            4,
            marks=EXTENDED,
        ),
        (["pipeline.schedule=zbv", "+stages=4", "placement.split=[2,2,1,1]"], 4),
        (["pipeline.schedule=1f1b", "+stages=2", "placement.split=[3,3]", "placement.replicas=2"], 8),
        (["pipeline.schedule=gpipe", "+stages=2", "placement.split=[3,3]", "trainer.grad_accum=2"], 8),
    ],
    ids=["gpipe", "1f1b", "zb1", "interleaved", "zbv", "1f1b-copies", "gpipe-accum2"],
)
def test_add_loss_per_microbatch_weighs_each_microbatch_s_terms_by_its_share(overrides, parts):
    """`pipeline.add_loss=per_microbatch` (M=4; with 2 copies, each copy's share in 4; with
    `trainer.grad_accum=2`, a step's two batches in 4 each: 8 parts): the step's
    loss is each microbatch's cross-entropy and `add_loss` terms weighed by its share, as computed by hand
    (which for a term over the batch differs from the whole batch's), and one SGD step equals a one-device
    tape loop summing the same weighted microbatches; the run's notes say so, and that such a term is not
    the whole batch's."""
    model = batch_terms_model()
    reference = copy_of(model)
    run = chain.build(chain.compose([*PER_MICROBATCH, *overrides]), model=model)
    (note,) = [n for n in run.assignment.notes if n.startswith("pipeline.add_loss=per_microbatch")]
    assert "stage(s) 0, 1 " in note and "mean over examples" in note and "MoE" in note
    x, ys = next(iter(run.batches()))
    x, y = np.asarray(x), np.asarray(ys["label"])
    per_part, whole = by_hand(reference, x, y, parts)
    assert abs(per_part - whole) > 1e-3  # the batch term's square of a mean: the parts' terms are not the whole's
    got = float(run.step(x, ys)["loss"])
    want = microbatch_sgd_step(reference, "/CPU:0", 0.5, parts)(tf.constant(x), tf.constant(y))
    np.testing.assert_allclose([got, want], per_part, rtol=1e-5)
    trained = {v.path: v.numpy() for s in run.stages for v in s.model.trainable_variables}
    for v, v0 in zip(reference.trainable_variables, model.trainable_variables):
        assert rel_diff(trained[v0.path], v.numpy()) <= 1e-5, v.path


def test_add_loss_per_microbatch_outside_a_pipeline_is_noted_as_ignored():
    notes = chain.compose([*SYNTH, "mode=local", "pipeline.add_loss=per_microbatch"]).notes
    assert any(n.startswith("pipeline.add_loss=per_microbatch ignored: mode=local") for n in notes)


def test_add_loss_on_microbatches_from_the_command_line_is_one_line_and_leaves_nothing(tmp_path):
    here = os.path.dirname(os.path.abspath(__file__))
    r = run_cli(
        tmp_path,
        "mode=e2e",
        "pipeline.microbatches=2",
        "trainer.steps=2",
        *SYNTH,
        "+stages=[{model: {_target_: user_nets.with_added_loss}},{model: {_target_: user_nets.head}}]",
        env={"PYTHONPATH": os.pathsep.join([here, os.environ.get("PYTHONPATH", "")])},
    )
    lines = [line for line in r.stderr.splitlines() if line.strip()]
    assert r.returncode == 2 and len(lines) == 1 and "use pipeline.add_loss=per_microbatch" in lines[0], r.stderr
    assert not (tmp_path / "outputs").exists()
