"""precision=mixed_bfloat16 / mixed_float16: stage bodies compute in the low precision with
float32 weights, training matches float32 training of the same chain within that
precision's rounding, and float16 loss scaling skips overflow steps chain-wide without
tripping the NaN guard."""

import keras
import numpy as np
import pytest
import tensorflow as tf

import chain
from chain.stages import loss_scale as ls
from chain.steps.update import apply_update, shared_outcomes
from chain.steps.numerics import NonFiniteError
from compare import norm_rel_diff, stage_vectors
from conftest import EXTENDED

LR = 0.1
BASE = [
    "+stages=3",
    "model.depth=1",
    "model.width=16",
    "optim=sgd",
    f"optim.lr={LR}",
    "data=synthetic",
    "data.features=6",
    "data.classes=4",
    "data.samples=256",
    "data.batch_size=16",
    "trainer.progress=false",
]
MODES = {"local": ["mode=local"], "e2e": ["mode=e2e", "pipeline.schedule=1f1b", "pipeline.microbatches=2"]}
# Runs compared with float32: the precision and any other switch.
LOW = {
    "mixed_bfloat16": ["precision=mixed_bfloat16"],
    "mixed_float16": ["precision=mixed_float16"],
    "mixed_bfloat16-xla": ["precision=mixed_bfloat16", "trainer.jit_compile=true"],
}
# Held to training (its loss falls), not to 2u of float32: it was excluded when, with ReLU
# bodies, it differed from float32 by 1.8e-3 (3.7u) after 5 steps on a CPU with AVX512_FP16.
# That is the figure a single ReLU tie produces on this stream (see SMOOTH), not per-operation
# float16 rounding; with SMOOTH it measures 2.5e-5 here (no AVX512_FP16), but it has not been
# measured on an AVX512_FP16 CPU since, so it stays out of LOW.
TRAINS = {**LOW, "mixed_float16-xla": ["precision=mixed_float16", "trainer.jit_compile=true"]}
# The compared chains' activation: smooth, so that rounding moves training by rounding-sized
# amounts (see test_low_precision_training_matches_float32_within_its_rounding).
SMOOTH = ["model.activation=tanh"]
# Unit roundoff (half an ulp at 1.0): bfloat16 keeps 8 significant bits, float16 11.
UNIT_ROUNDOFF = {"mixed_bfloat16": 2.0**-8, "mixed_float16": 2.0**-11}


def precision_of(variant: str) -> str:
    return variant.split("-")[0]


COMPARED = 5  # steps over which the runs are compared
STEPS = 30  # steps over which the loss must fall


def state(run) -> list[np.ndarray]:
    """Every weight and optimizer variable (slots and iteration counts) of every stage."""
    return [v.numpy().copy() for s in run.stages for v in s.trainable_variables + list(s.optimizer.variables)]


# EXTENDED: the suite's time; mode=e2e's runs every time, mode=local's low precision in test_speed_cli's bfloat16
# run and the float16 loss-scale tests below
@pytest.fixture(scope="module", params=[pytest.param("local", marks=EXTENDED), "e2e"])
def trained(request) -> dict:
    """For one mode, the same chain in float32 and every low-precision variant, trained on the same batches."""
    mode = request.param
    variants = {"float32": [], **TRAINS}
    runs = {v: chain.build(chain.compose(BASE + SMOOTH + MODES[mode] + over)) for v, over in variants.items()}
    initial = {p: stage_vectors(r) for p, r in runs.items()}
    losses = {p: [] for p in runs}
    at_compared = {}
    it = iter(runs["float32"].batches())
    for step in range(1, STEPS + 1):
        x, ys = next(it)
        for p, r in runs.items():
            losses[p].append(r.step(x, ys)["loss"])
        if step == COMPARED:
            at_compared = {p: stage_vectors(r) for p, r in runs.items()}
    return dict(mode=mode, runs=runs, initial=initial, losses=losses, at_compared=at_compared)


@pytest.mark.parametrize("variant", LOW)
def test_stage_bodies_compute_in_the_low_precision_with_float32_stage_vectors(trained, variant):
    mode, run = trained["mode"], trained["runs"][variant]
    precision = precision_of(variant)
    low = precision.removeprefix("mixed_")
    for s in run.stages:
        dense = [layer for layer in s.model.layers if isinstance(layer, keras.layers.Dense)]
        body = dense[:-1] if mode == "e2e" and s is run.stages[-1] else dense
        assert body and all(layer.compute_dtype == low for layer in body)
        assert all(v.dtype == "float32" for v in s.trainable_variables)  # weights stay float32
        readouts = [dense[-1]] if mode == "e2e" and s is run.stages[-1] else list(s.head.layers) if s.head else []
        assert all(layer.compute_dtype == "float32" for layer in readouts)
        assert (s.loss_scale is not None) == (precision == "mixed_float16")
    # Set per layer at build time, never globally: other models of the process stay float32.
    assert keras.config.dtype_policy().name == "float32"
    assert keras.layers.Dense(2).compute_dtype == "float32"


@pytest.mark.parametrize("variant", LOW)
def test_low_precision_training_matches_float32_within_its_rounding(trained, variant):
    """Tolerance: 2u relative, u the unit roundoff (bfloat16: 2^-8, float16: 2^-11).

    Losses: the loss is computed in float32 from a float32 read-out whose input carries
    the body's rounding, about u relative, so the two runs' losses stay within 2u.
    Weights: both runs keep float32 weights, but the low-precision forward pass sees each
    weight rounded to u relative; after 5 SGD steps (lr 0.1) each stage's weights must
    agree within 2u of their norm, i.e. at the resolution the low-precision run computes
    with. (Longer runs drift further apart, as any perturbation of training does; the
    loss-falls test covers them.) The comparison has teeth: training moved every stage by
    more than the tolerance, and the low-precision runs do differ from float32. The bfloat16
    run compiled with XLA is held to bfloat16's tolerance (float16 with XLA: see TRAINS).

    The argument needs training to depend smoothly on the rounding, hence SMOOTH (tanh).
    A ReLU is a step in the gradient: an example whose float32 pre-activation lies within
    the low precision's rounding of zero can fall on the other side of the kink, and its
    whole gradient through that unit is then added in one run and not in the other. With
    ReLU, local float16 met exactly that at step 3: stage 0, example 12, unit 9, float32
    pre-activation +9.7e-5, while rounding x and the weights to float16 moves it by up to
    2u*sum|x*w| = 8e-4 (xw = 0.013360 against a bias of -0.013362). Which side it lands on
    depends on the CPU's kernels, not on chain. TensorFlow gives float16 to oneDNN only on
    CPUs with AVX512_FP16 (or AMX_FP16, AVX_NE_CONVERT), whose fused matmul adds the bias
    before its one rounding: +1.3e-6, ReLU passes (CI's CPU; not run here, but the same
    Dense computed that way here, ReLU bodies, stays within 0.035u).
    Without them, Eigen's MatMul (float32 accumulation, the result rounded once: measured
    for K = 6..1024) and a separate float16 BiasAdd round twice: 0.013359 - 0.013359 = 0,
    and ReLU blocks it. That example's step on unit 9 (7 weights, up to 4.1e-3) is then the
    whole 1.8e-3 (3.7u) difference from float32; without it the rest is 0.025u. Measured
    with tanh (AMD EPYC: avx512_bf16, no AVX512_FP16), both modes: weights bfloat16 <=
    2.0e-4, float16 <= 2.5e-5 (0.05u); losses bfloat16 <= 5.2e-4, float16 <= 6.7e-5 (0.14u).
    """
    t = trained
    u = UNIT_ROUNDOFF[precision_of(variant)]
    for a, b in zip(t["initial"][variant], t["initial"]["float32"]):
        np.testing.assert_array_equal(a, b)  # same seed, same float32 initial weights
    got, want = np.array(t["losses"][variant][:COMPARED]), np.array(t["losses"]["float32"][:COMPARED])
    assert np.max(np.abs(got - want) / np.abs(want)) <= 2 * u
    for k, (w, ref, w0) in enumerate(
        zip(t["at_compared"][variant], t["at_compared"]["float32"], t["initial"]["float32"])
    ):
        assert norm_rel_diff(w, ref) <= 2 * u, k
        assert np.linalg.norm(ref - w0) > 2 * 2 * u * np.linalg.norm(ref), k  # moved well beyond the tolerance
        assert not np.array_equal(w, ref), k  # the low-precision path really ran


@pytest.mark.parametrize("variant", TRAINS)
def test_low_precision_loss_falls(trained, variant):
    losses = trained["losses"][variant]
    assert np.mean(losses[-5:]) < 0.95 * np.mean(losses[:5])


# --- float16 loss scaling ----------------------------------------------------------------

FLOAT16 = {
    "e2e": BASE + MODES["e2e"] + ["precision=mixed_float16"],
    "local": BASE + MODES["local"] + ["precision=mixed_float16"],
    "mirrored-e2e": BASE + ["mode=e2e", "placement.fallback=mirrored", "precision=mixed_float16"],
}
PLANTED = 2.0**40  # scaled gradients beyond float16's largest value (65504)


@pytest.mark.parametrize("case", FLOAT16)
def test_a_float16_overflow_step_is_skipped_everywhere_halves_the_scale_and_training_continues(case):
    run = chain.build(chain.compose(FLOAT16[case] + ["trainer.on_nan=stop"]))
    it = iter(run.batches())
    first = run.step(*next(it))["loss"]
    for s in run.stages:
        s.loss_scale.scale.assign(PLANTED)  # plant an overflow: the next step's gradients are Inf
    before = state(run)
    out = run.step(*next(it))  # on_nan=stop, yet no NonFiniteError: an overflow is not a NaN
    assert out["skipped"] == [] and np.isfinite(out["loss"])
    after = state(run)
    assert all(np.array_equal(a, b) for a, b in zip(before, after))  # weights, slots, iterations untouched
    assert [float(s.loss_scale.scale.numpy()) for s in run.stages] == [PLANTED / 2] * len(run.stages)
    assert [int(s.loss_scale.overflows.numpy()) for s in run.stages] == [1] * len(run.stages)
    assert [int(s.skipped.numpy()) for s in run.stages] == [0] * len(run.stages)
    # Training continues: the scale halves (one skipped step each) until the gradients fit
    # (about 2^18 here), then updates resume.
    losses = [run.step(*next(it))["loss"] for _ in range(40)]
    scales = [float(s.loss_scale.scale.numpy()) for s in run.stages]
    assert all(sc < PLANTED / 2 for sc in scales)
    if case != "local":  # one loss, one scale: every stage's copy took the same outcomes
        assert len(set(scales)) == 1
        assert len({int(s.loss_scale.overflows.numpy()) for s in run.stages}) == 1
    iterations = [int(s.optimizer.iterations.numpy()) for s in run.stages]
    overflows = [int(s.loss_scale.overflows.numpy()) for s in run.stages]
    assert [i + o for i, o in zip(iterations, overflows)] == [42] * len(run.stages)  # every step: update or overflow
    assert min(iterations) > 10
    assert np.mean(losses[-5:]) < first


@pytest.mark.parametrize("case", ["e2e", "local"])
def test_float16_still_stops_on_a_genuinely_non_finite_loss(case):
    # Linear activations carry a NaN input to every stage's loss.
    run = chain.build(chain.compose(FLOAT16[case] + ["model.activation=linear", "trainer.on_nan=stop"]))
    it = iter(run.batches())
    run.step(*next(it))
    x, ys = next(it)
    bad = x.numpy().copy()
    bad[0, 0] = np.nan
    before = state(run)
    with pytest.raises(NonFiniteError, match=r"^stage 0, stage 1, stage 2: loss or gradients are not finite at step 2"):
        run.step(bad, ys)
    assert all(np.array_equal(a, b) for a, b in zip(before, state(run)))
    # Not an overflow: the scale is kept, and the guard counted the step.
    assert [float(s.loss_scale.scale.numpy()) for s in run.stages] == [ls.INITIAL_SCALE] * 3
    assert [int(s.loss_scale.overflows.numpy()) for s in run.stages] == [0] * 3
    assert [int(s.skipped.numpy()) for s in run.stages] == [1] * 3


@pytest.mark.parametrize("mode", MODES)
def test_an_overflow_in_one_stage_skips_the_whole_chain_in_e2e_and_only_that_stage_in_local(mode):
    """mode=e2e: one scaled loss, one decision: stage 1's overflow skips stages 0 and 2 too,
    and every stage's copy of the scale halves. mode=local: each stage has its own loss and
    scale, so only stage 1 skips."""
    run = chain.build(chain.compose(FLOAT16["e2e" if mode == "e2e" else "local"]))
    grads = [[tf.fill(v.shape, 0.5) for v in s.trainable_variables] for s in run.stages]
    grads[1][0] = tf.fill(grads[1][0].shape, np.inf)  # as an overflowed unscaled gradient arrives
    loss = tf.constant(1.0)

    @tf.function
    def update():
        if run.settings.mode == "e2e":
            outcomes = shared_outcomes(run.stages, grads, loss, run.stages[-1].device)
        else:
            outcomes = [None] * len(run.stages)
        for s, g, outcome in zip(run.stages, grads, outcomes):
            with tf.device(s.device):
                apply_update(s, g, None if run.settings.mode == "e2e" else loss, outcome)

    update()
    iterations = [int(s.optimizer.iterations.numpy()) for s in run.stages]
    scales = [float(s.loss_scale.scale.numpy()) for s in run.stages]
    if mode == "e2e":
        assert iterations == [0, 0, 0] and scales == [ls.INITIAL_SCALE / 2] * 3
    else:
        assert iterations == [1, 0, 1] and scales == [ls.INITIAL_SCALE, ls.INITIAL_SCALE / 2, ls.INITIAL_SCALE]
    assert [int(s.skipped.numpy()) for s in run.stages] == [0, 0, 0]  # an overflow is no NaN event


def graph_ops(f, op_type: str, *args) -> int:
    """How many `op_type` ops `f`'s graph holds, the branches of its conds included."""
    graph = f.get_concrete_function(*args).graph.as_graph_def()
    return sum(n.op == op_type for n in graph.node) + sum(
        n.op == op_type for fn in graph.library.function for n in fn.node_def
    )


@pytest.mark.parametrize("mode", MODES)
def test_apply_update_returns_the_guards_verdict_from_one_finite_check(mode):
    """One outcome value: `apply_update` returns whether the numerics guard dropped the update,
    so an overflow (the loss scale's skip) is False and a NaN loss is True, with no flag turned
    over on the way. Finiteness is computed once: each gradient is summed once per step (the
    loss scale's decision and the guard read the same flag), not once for each of them."""
    run = chain.build(chain.compose(FLOAT16["e2e" if mode == "e2e" else "local"]))
    grads = [[tf.fill(v.shape, 0.5) for v in s.trainable_variables] for s in run.stages]
    grads[1][0] = tf.fill(grads[1][0].shape, np.inf)

    @tf.function
    def update(loss):
        e2e = run.settings.mode == "e2e"
        outcomes = shared_outcomes(run.stages, grads, loss, run.stages[-1].device) if e2e else [None] * 3
        flags = []
        for s, g, outcome in zip(run.stages, grads, outcomes):
            with tf.device(s.device):
                flags.append(apply_update(s, g, None if e2e else loss, outcome))
        return flags

    assert [bool(d) for d in update(tf.constant(1.0))] == [False] * 3  # an overflow: no guard drop
    if mode == "e2e":
        assert [bool(d) for d in update(tf.constant(1.0))] == [False] * 3
    else:
        assert [bool(d) for d in update(tf.constant(np.nan))] == [True] * 3  # the guard drops every stage
    n_grads = sum(len(g) for g in grads)
    assert graph_ops(update, "Sum", tf.constant(1.0)) == n_grads


def test_decide_separates_overflow_from_non_finite():
    finite, inf = tf.constant(True), tf.constant(False)
    cases = [  # (loss, flags, scale) -> outcome
        ((1.0, [finite, finite], 8.0), ls.FINITE),
        ((1.0, [finite, inf], 8.0), ls.OVERFLOW),  # one member overflowed: the whole group skips
        ((1.0, [finite, inf], ls.MIN_SCALE), ls.NONFINITE),  # no smaller scale could help
        ((np.nan, [finite, finite], 8.0), ls.NONFINITE),  # the loss itself is not finite
        ((np.inf, [inf, inf], 8.0), ls.NONFINITE),
    ]
    for (loss, flags, scale), want in cases:
        assert int(ls.decide(tf.constant(loss), flags, tf.constant(scale))) == want, (loss, scale)


def test_loss_scale_grows_after_growth_steps_finite_steps_and_halves_on_overflow():
    scale = ls.LossScale(8.0, growth_steps=3)
    applied = []

    def guarded():
        applied.append(1)
        return tf.constant(True)

    for _ in range(2):
        scale.update(tf.constant(ls.FINITE), guarded)
    assert float(scale.scale.numpy()) == 8.0 and int(scale.good_steps.numpy()) == 2
    scale.update(tf.constant(ls.FINITE), guarded)
    assert float(scale.scale.numpy()) == 16.0 and int(scale.good_steps.numpy()) == 0
    assert not bool(scale.update(tf.constant(ls.OVERFLOW), guarded))
    assert float(scale.scale.numpy()) == 8.0 and int(scale.overflows.numpy()) == 1
    scale.update(tf.constant(ls.NONFINITE), guarded)  # the guard decides; the scale stays
    assert float(scale.scale.numpy()) == 8.0 and len(applied) == 4


@pytest.mark.parametrize(
    "value, message",
    [
        ("1000", "trainer.initial_loss_scale=1000 must be a power of two (e.g. 512 or 1024)"),
        ("0", "trainer.initial_loss_scale=0 must be > 0"),
    ],
)
def test_initial_loss_scale_must_be_a_power_of_two(value, message):
    with pytest.raises(chain.ConfigError) as e:
        chain.compose([f"trainer.initial_loss_scale={value}"])
    assert str(e.value).startswith(message) and "\n" not in str(e.value)


def test_an_unknown_precision_is_one_line_naming_the_key():
    with pytest.raises(chain.ConfigError) as e:
        chain.compose(["precision=float8"])
    assert str(e.value) == (
        "precision='float8' is not known; allowed: float32, mixed_float16, mixed_bfloat16; "
        "did you mean precision=float32?"
    )
