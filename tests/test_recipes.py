"""The recipes language models train with: AdamW (decoupled weight decay, biases and norms left
out), learning-rate schedules (a linear warm-up, then a cosine or linear decay to a floor), any
Keras optimizer by `_target_`, and an embedding's sparse gradient under Adam.

The oracle is Keras itself: `keras.optimizers.AdamW` with `keras.optimizers.schedules.CosineDecay`
(or a schedule given as Keras' `PiecewiseConstantDecay` of the documented values), and Keras' own
sparse Adam update of an Embedding, through `train_on_batch` of the uncut model on one device.
"""

from __future__ import annotations

import glob
import os

import keras
import numpy as np
import pytest
import tensorflow as tf

import chain
from chain.errors import ConfigError
from chain.stages.fused import FusedAdam, FusedAdamW
from conftest import EXTENDED
from compare import rel_diff
from conftest import read_summary, stage_values, straight_and_resumed

L = keras.layers
RUN = [
    "+stages=2",
    "mode=e2e",
    "data=synthetic",
    "data.features=6",
    "data.classes=4",
    "data.samples=64",
    "data.batch_size=16",
    "trainer.progress=false",
    "checkpoint.export=false",
]
RTOL = 1e-5  # as the other equality tests
STEPS = 4


def normed_model() -> keras.Model:
    """Dense, LayerNormalization, Dense | Dense, RMSNormalization, Dense (cut 3 + 3): biases and
    norms on both stages, for the decay's exclusions (per-example norms: microbatches do not change them)."""
    keras.utils.set_random_seed(3)
    layers = [
        L.Dense(8, activation="tanh", name="d0"),
        L.LayerNormalization(name="ln"),
        L.Dense(8, name="d1"),
        L.Dense(8, activation="tanh", name="d2"),
        L.RMSNormalization(name="rms"),
        L.Dense(4, name="out"),
    ]
    return keras.Sequential([keras.Input((6,)), *layers], name="normed")


def batches(n: int, vocab: int | None = None) -> list[tuple[np.ndarray, np.ndarray]]:
    rng = np.random.default_rng(0)
    make = (
        (lambda: rng.integers(0, vocab, (16, 6)).astype("float32"))
        if vocab
        else (lambda: rng.standard_normal((16, 6)).astype("float32"))
    )
    return [(make(), rng.integers(0, 4, 16).astype("int32")) for _ in range(n)]


def assert_trains_like(run, reference: keras.Model, data) -> None:
    """The chain's losses and weights after `data`'s steps equal `reference.train_on_batch`'s on
    the same batches within RTOL, and every weight moved well beyond it."""
    start = [v.numpy() for v in reference.trainable_variables]
    for x, y in data:
        got = run.step(x, {"label": y})
        np.testing.assert_allclose(got["loss"], reference.train_on_batch(x, y), rtol=RTOL)
    chained = [v for s in run.stages for v in s.trainable_variables]
    for v, w, w0 in zip(chained, reference.trainable_variables, start, strict=True):
        assert rel_diff(v.numpy(), w.numpy()) <= RTOL, v.path
        assert rel_diff(w.numpy(), w0) > 100 * RTOL, v.path  # training moved it


def compiled(model: keras.Model, optimizer: keras.optimizers.Optimizer) -> keras.Model:
    model.compile(
        optimizer=optimizer, loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True), jit_compile=False
    )
    return model


def keras_adamw(fused: bool, learning_rate, model: keras.Model) -> keras.optimizers.Optimizer:
    """Keras' AdamW (or the same kernel as chain's fused one) with the usual exclusions, made the
    way Keras documents it: biases by name, the norm layers' variables by list."""
    cls = FusedAdamW if fused else keras.optimizers.AdamW
    opt = cls(learning_rate=learning_rate, weight_decay=0.5, beta_1=0.9, beta_2=0.999)
    norms = [
        v
        for layer in model.layers
        if isinstance(layer, (L.LayerNormalization, L.RMSNormalization))
        for v in layer.trainable_variables
    ]
    opt.exclude_from_weight_decay(var_list=norms, var_names=["bias"])
    return opt


ADAMW = ["optim=adamw", "optim.lr=0.02", "optim.weight_decay=0.5", "optim.fused=false"]  # Keras' own update


def test_fused_adamw_is_keras_adamw_within_float32_rounding():
    """FusedAdamW against Keras' AdamW over 12 updates from fixed gradients, one variable left out
    of the decay: the decay is Keras' own (bit for bit where the Adam part does not differ), the
    Adam part within the fused Adam's float32 rounding (tests/test_fused.py)."""
    rng = np.random.default_rng(0)
    shapes, lr = [(12, 8), (8,), (8, 3)], 1e-3
    grads = [[tf.constant(rng.standard_normal(s).astype("float32")) for s in shapes] for _ in range(12)]
    start = [rng.standard_normal(s).astype("float32") for s in shapes]
    states = []
    for cls in (keras.optimizers.AdamW, FusedAdamW):
        variables = [keras.Variable(v) for v in start]
        opt = cls(learning_rate=lr, weight_decay=0.5)
        opt.exclude_from_weight_decay(var_list=[variables[1]])
        opt.build(variables)
        step = tf.function(lambda gs: opt.apply(gs, variables), autograph=False)  # noqa: B023 - called at once
        for gs in grads:
            step(gs)
        states.append([v.numpy() for v in variables + list(opt.variables)])
    for a, b in zip(*states, strict=True):
        np.testing.assert_allclose(b, a, rtol=2e-5, atol=2e-5 * lr * 12)
    moved = [np.max(np.abs(w - w0)) for w, w0 in zip(states[0][:3], start)]
    assert min(moved) > 100 * 2e-5 * lr  # the updates (decay included) are far above the tolerance


@pytest.mark.parametrize(
    "fused, overrides",
    [
        (False, ["pipeline.schedule=1f1b", "pipeline.microbatches=4"]),
        (True, ["pipeline.schedule=gpipe", "pipeline.microbatches=2"]),
        # the suite's time: Keras' AdamW and the fused one follow the schedule every time in the pipelines above
        pytest.param(False, ["placement.fallback=mirrored"], marks=EXTENDED),
        pytest.param(True, ["placement.replicas=2", "pipeline.microbatches=2"], marks=EXTENDED),
    ],
    ids=["keras-1f1b-M4", "fused-gpipe-M2", "mirrored", "fused-2-copies"],
)
def test_adamw_with_warmup_and_cosine_trains_like_keras_adamw_on_one_device(fused, overrides):
    """2 stages, AdamW with decay 0.5 (biases and norms excluded) and 2 warm-up steps then a cosine
    to 10% at step 5: the weights of Keras' AdamW with Keras' CosineDecay, step for step."""
    cfg = [
        *RUN,
        *ADAMW,
        f"optim.fused={str(fused).lower()}",
        "optim.schedule=warmup_cosine",
        "optim.warmup_steps=2",
        "optim.decay_steps=5",
        "optim.floor=0.1",
        *overrides,
    ]
    run = chain.build(chain.compose(cfg), model=normed_model())
    reference = normed_model()
    cosine = keras.optimizers.schedules.CosineDecay(0.0, 3, alpha=0.1, warmup_target=0.02, warmup_steps=2)
    assert_trains_like(run, compiled(reference, keras_adamw(fused, cosine, reference)), batches(STEPS + 1))
    assert all(int(s.optimizer.iterations.numpy()) == STEPS + 1 for s in run.stages)  # one per step, each stage


def test_warmup_linear_follows_its_documented_learning_rates():
    """warmup_linear: lr x s / W during the warm-up, then linear to floor x lr at decay_steps, then
    the floor; the chain trains as Keras' AdamW given those rates (PiecewiseConstantDecay)."""
    lr, warm, end, floor = 0.02, 2, 5, 0.25
    documented = [
        lr * s / warm if s < warm else lr * (floor + (1 - floor) * max(0.0, (end - s) / (end - warm))) for s in range(7)
    ]
    cfg = [
        *RUN,
        *ADAMW,
        "optim.schedule=warmup_linear",
        f"optim.warmup_steps={warm}",
        f"optim.decay_steps={end}",
        f"optim.floor={floor}",
        "pipeline.microbatches=2",
    ]
    run = chain.build(chain.compose(cfg), model=normed_model())
    schedule = run.stages[0].optimizer._learning_rate  # noqa: SLF001 - the schedule object itself
    np.testing.assert_allclose([float(schedule(s)) for s in range(7)], documented, rtol=1e-6)
    reference = normed_model()
    given = keras.optimizers.schedules.PiecewiseConstantDecay(list(range(5)), documented[:6])
    assert_trains_like(run, compiled(reference, keras_adamw(False, given, reference)), batches(6))


def test_no_decay_chooses_what_the_decay_leaves_out():
    """`optim.no_decay=[]` decays every variable (Keras' AdamW without exclusions); a word of a
    variable's path leaves those out."""
    run = chain.build(chain.compose([*RUN, *ADAMW, "optim.no_decay=[]"]), model=normed_model())
    reference = normed_model()
    assert_trains_like(run, compiled(reference, keras.optimizers.AdamW(0.02, weight_decay=0.5)), batches(2))
    run = chain.build(chain.compose([*RUN, *ADAMW, "optim.no_decay=[d1/kernel]"]), model=normed_model())
    reference = normed_model()
    opt = keras.optimizers.AdamW(0.02, weight_decay=0.5)
    opt.exclude_from_weight_decay(var_list=[reference.get_layer("d1").kernel])
    assert_trains_like(run, compiled(reference, opt), batches(2))


def test_any_keras_optimizer_by_target_with_a_schedule():
    """`optim._target_=keras.optimizers.RMSprop` with its own keyword argument and a warm-up: one
    instance per stage, on its device, trains as Keras' RMSprop with Keras' CosineDecay."""
    cfg = [
        *RUN,
        "optim._target_=keras.optimizers.RMSprop",
        "optim.rho=0.8",
        "optim.learning_rate=0.01",
        "optim.schedule=warmup_cosine",
        "optim.warmup_steps=1",
        "optim.decay_steps=4",
        "pipeline.microbatches=2",
    ]
    run = chain.build(chain.compose(cfg), model=normed_model())
    assert len({id(s.optimizer) for s in run.stages}) == 2
    assert all(type(s.optimizer) is keras.optimizers.RMSprop and s.optimizer.rho == 0.8 for s in run.stages)
    reference = normed_model()
    cosine = keras.optimizers.schedules.CosineDecay(0.0, 3, warmup_target=0.01, warmup_steps=1)
    assert_trains_like(run, compiled(reference, keras.optimizers.RMSprop(cosine, rho=0.8)), batches(3))


def test_a_stage_may_name_its_own_keras_optimizer():
    s = chain.compose(["+stages=[{optim: {_target_: keras.optimizers.SGD, momentum: 0.5}},{optim: {lr: 0.1}}]"])
    first, second = (st.optim for st in s.stages)
    assert (first._target_, first.kwargs, first.lr) == ("keras.optimizers.SGD", {"momentum": 0.5}, 0.001)
    assert (second.name, second.lr) == ("adam", 0.1)


@pytest.mark.parametrize(
    "overrides, message",
    [
        (
            ["optim.schedule=cosine"],
            "optim.schedule='cosine' is not known; allowed: constant, warmup_cosine, "
            "warmup_linear; did you mean optim.schedule=warmup_cosine?",
        ),
        (
            ["optim.schedule=warmup_cosine", "optim.warmup_steps=10", "trainer.steps=10"],
            "optim.schedule=warmup_cosine decays from step optim.warmup_steps=10 to trainer.steps=10 "
            "(optim.decay_steps=null): the decay must end after the warm-up; raise optim.decay_steps or lower "
            "optim.warmup_steps",
        ),
        (["optim.floor=2"], "optim.floor=2 must be <= 1"),
        (["optim=adamw", "optim.weight_decay=-1"], "optim.weight_decay=-1 must be >= 0.0"),
        (
            ["optim._target_=keras optimizers"],
            "optim._target_='keras optimizers' must be an optimizer's import path, e.g. keras.optimizers.RMSprop",
        ),
    ],
)
def test_bad_recipe_settings_are_one_line_naming_the_key(overrides, message):
    with pytest.raises(ConfigError) as e:
        chain.compose(overrides)
    assert str(e.value) == message


@pytest.mark.parametrize(
    "target, message",
    [
        ("keras.optimizers.RMSpro", "optim._target_=keras.optimizers.RMSpro"),
        ("keras.layers.Dense", "optim._target_=keras.layers.Dense"),
    ],
)
def test_a_target_that_is_not_a_keras_optimizer_is_one_line(target, message):
    with pytest.raises(ConfigError) as e:
        chain.build(chain.compose([*RUN, f"optim._target_={target}"]))
    assert str(e.value).startswith(message) and "\n" not in str(e.value)


# --- an embedding's sparse gradient under Adam ---------------------------------------------------

VOCAB = 4  # 96 tokens a batch over 4 ids: every row of the table occurs many times


def embedding_model() -> keras.Model:
    """Token ids (as floats: Embedding casts them) -> an untied Embedding, mean, Dense, Dense (cut 2 + 2)."""
    keras.utils.set_random_seed(4)
    return keras.Sequential(
        [
            keras.Input((6,)),
            L.Embedding(VOCAB, 8, name="embed"),
            L.GlobalAveragePooling1D(name="pool"),
            L.Dense(8, activation="tanh", name="mix"),
            L.Dense(4, name="out"),
        ],
        name="embedded",
    )


def densified_adam_weights(data) -> np.ndarray:
    """The embedding table after a one-device loop whose Adam takes the gradient densified: the
    reference chain does not follow (it differs from Keras' sparse update by far more than RTOL)."""
    model = embedding_model()
    opt = keras.optimizers.Adam(0.05)
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    for x, y in data:
        with tf.GradientTape() as tape:
            value = loss(y, model(x, training=True))
        grads = tape.gradient(value, model.trainable_variables)
        opt.apply([tf.convert_to_tensor(g) for g in grads], model.trainable_variables)
    return model.get_layer("embed").embeddings.numpy()


@pytest.mark.parametrize(
    "overrides",
    [
        ["pipeline.schedule=gpipe", "pipeline.microbatches=1"],
        # the suite's time: the microbatches' sparse gradients are joined every time in the other cases
        pytest.param(["pipeline.schedule=1f1b", "pipeline.microbatches=4"], marks=EXTENDED),
        ["pipeline.schedule=zb1", "pipeline.microbatches=2"],
        ["pipeline.schedule=gpipe", "pipeline.microbatches=2", "optim.fused=true"],
        ["pipeline.microbatches=2", "trainer.grad_accum=2"],
        ["pipeline.microbatches=2", "optim.clip_global_norm=0.01"],
    ],
    ids=["gpipe-M1", "1f1b-M4", "zb1-M2", "fused-M2", "M2-accum2", "M2-clipped"],
)
def test_an_embedding_under_adam_trains_like_keras_sparse_update(overrides):
    """Chain's reference for an embedding under Adam is Keras' own sparse update (what `model.fit`
    does): the microbatches' sparse gradients are joined row for row, never densified, so the table
    equals `train_on_batch`'s, and not a densified Adam's."""
    accum = 2 if "trainer.grad_accum=2" in overrides else 1
    run = chain.build(
        chain.compose([*RUN, "optim=adam", "optim.lr=0.05", "optim.fused=false", *overrides]), model=embedding_model()
    )
    reference = embedding_model()
    clip = run.settings.stages[0].optim.clip_global_norm  # the step clips the chain; Keras' optimizer, the model
    opt = type(run.stages[0].optimizer).from_config({**run.stages[0].optimizer.get_config(), "global_clipnorm": clip})
    assert isinstance(opt, FusedAdam) == ("optim.fused=true" in overrides)
    data = batches(3 * accum, vocab=VOCAB)
    if accum == 1:
        assert_trains_like(run, compiled(reference, opt), data)
    else:  # two batches a step: the reference takes them as one batch of 32
        joined = [(np.concatenate([a[0], b[0]]), np.concatenate([a[1], b[1]])) for a, b in zip(data[::2], data[1::2])]
        assert_trains_like(run, compiled(reference, opt), joined)
        data = joined
    table = run.stages[0].model.get_layer("embed").embeddings.numpy()
    assert rel_diff(table, densified_adam_weights(data)) > 100 * RTOL


# --- resume ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "recipe",
    [
        ["optim=adamw", "optim.fused=true", "optim.schedule=warmup_cosine", "optim.warmup_steps=6"],
        pytest.param(  # the suite's time: its schedule and floor are also checked against Keras above
            [
                "optim._target_=keras.optimizers.RMSprop",
                "optim.schedule=warmup_linear",
                "optim.warmup_steps=6",
                "optim.floor=0.1",
            ],
            marks=EXTENDED,
        ),
    ],
    ids=["adamw-warmup-cosine", "rmsprop-warmup-linear"],
)
def test_a_schedule_resumes_bit_exact_from_a_checkpoint_inside_the_warmup(tmp_path, recipe):
    """Killed at step 5 after the checkpoint of step 3 (inside the 6-step warm-up), resumed: every
    variable (the optimizer's step count, which sets the schedule, included) and the losses equal an
    uninterrupted run's, bit for bit."""
    n, every, kill_at = 8, 3, 5
    args = [
        "+stages=2",
        "mode=e2e",
        "pipeline.schedule=1f1b",
        "pipeline.microbatches=2",
        "model.width=16",
        "model.dropout=0.2",
        "data.batch_size=32",
        "trainer.progress=false",
        *recipe,
        "optim.lr=0.01",
        f"trainer.steps={n}",
        f"checkpoint.every={every}",
        "trainer.log_every=1",
    ]
    straight, resumed = straight_and_resumed(tmp_path, args, every, kill_at)
    for k in range(2):
        a, b = stage_values(straight, f"stage_{k:02d}"), stage_values(resumed, f"stage_{k:02d}")
        assert set(a) == set(b)
        assert any("iteration" in key for key in a)  # the schedule's step is in the checkpoint
        for key in a:
            assert a[key].dtype == b[key].dtype and np.array_equal(a[key], b[key]), (k, key)
    s, t = read_summary(straight), read_summary(resumed)
    assert t["resumed_from"] == every and (t["loss_first"], t["loss_last"]) == (s["loss_first"], s["loss_last"])
    if "optim=adamw" in recipe:  # TensorBoard's lr: the rate each step's update used, Keras' CosineDecay's
        events = glob.glob(os.path.join(straight, "tb", "chain", "*"))
        logged = {
            e.step: float(tf.make_ndarray(v.tensor))
            for path in events
            for e in tf.compat.v1.train.summary_iterator(path)
            for v in e.summary.value
            if v.tag == "lr"
        }
        cosine = keras.optimizers.schedules.CosineDecay(0.0, n - 6, warmup_target=0.01, warmup_steps=6)
        assert sorted(logged) == list(range(1, n + 1))
        np.testing.assert_allclose(
            [logged[k] for k in sorted(logged)], [float(cosine(k - 1)) for k in sorted(logged)], rtol=1e-6
        )


def test_a_warmup_schedule_round_trips_through_the_optimizers_config():
    """`optimizer.get_config()` / `from_config` (what a user's copy of a stage's optimizer does) rebuild the
    warm-up and the decay after it: the same rates at every step."""
    from chain.stages.lr_schedules import Warmup

    warm = Warmup(0.1, 4, keras.optimizers.schedules.PolynomialDecay(0.1, 10, end_learning_rate=0.01, power=1.0))
    config = keras.optimizers.Adam.from_config(keras.optimizers.Adam(learning_rate=warm).get_config()).get_config()
    again = keras.optimizers.schedules.deserialize(config["learning_rate"])
    assert isinstance(again, Warmup)
    assert [float(again(s)) for s in range(16)] == [float(warm(s)) for s in range(16)]
