"""Weights shared by several stages. A model cut into stages whose later layer reuses an earlier
layer's weight (a tied embedding) trains with one copy per stage holding it, the copies'
gradients summed before each update (`chain.steps.tied`): equal to the uncut model trained by
Keras on one device, copies identical. What is still refused is refused in one line: a layer
object two stage builders share (never silently untied, nor updated twice a step by two stages'
optimizers), and a tied weight across stages under a strategy whose step does not sum it. Where a
tied weight lives is settled before any stage is built: stages built in any order are the same."""

from __future__ import annotations

import keras
import numpy as np
import pytest
import tensorflow as tf

import chain
from chain.state import tied_copies
from chain.state.checkpoints import Checkpoints
from compare import rel_diff
from chain.errors import ConfigError
from chain.planning.devices import canonical
from chain.stages import cut
from chain.stages.stage import stage_name
from chain.strategies import base

L = keras.layers
RUN = [
    "+stages=2",
    "data=synthetic",
    "data.features=6",
    "data.classes=4",
    "data.samples=64",
    "data.batch_size=16",
    "trainer.progress=false",
    "checkpoint.export=false",
]
RTOL = 1e-5


class TiedReadout(L.Layer):
    """Logits from the embedding's own matrix (a tied embedding): it holds the Embedding layer, which
    its config leaves out (the cut binds the stage's copy of it)."""

    def __init__(self, embedding=None, **kwargs):
        super().__init__(**kwargs)
        self.embedding = embedding

    def get_config(self):
        return super().get_config()

    def call(self, h):
        return h @ keras.ops.transpose(self.embedding.embeddings)


@keras.saving.register_keras_serializable("test_shared_weights")
class SavedTiedReadout(TiedReadout):
    """TiedReadout as a user who saves their model writes it: its config holds the Embedding, which
    Keras' loading binds to the model's own layer again (one variable after `load_model`)."""

    def __init__(self, embedding=None, **kwargs):
        if isinstance(embedding, dict):
            embedding = keras.saving.deserialize_keras_object(embedding)
        super().__init__(embedding, **kwargs)

    def get_config(self):
        return {**super().get_config(), "embedding": keras.saving.serialize_keras_object(self.embedding)}


def tied_embedding_model(readout: type = TiedReadout) -> keras.Model:
    """Token ids (as floats: Embedding casts them) -> embedding, mean, Dense -> logits through the
    embedding's matrix: cut 2 + 2, the matrix is used on both stages."""
    keras.utils.set_random_seed(2)
    x = keras.Input((6,))
    embedding = L.Embedding(4, 8, name="embed")
    h = L.GlobalAveragePooling1D(name="pool")(embedding(x))
    h = L.Dense(8, activation="tanh", name="mix")(h)
    return keras.Model(x, readout(embedding, name="tied")(h), name="tied_lm")


@pytest.mark.parametrize(
    "overrides",
    [
        ["optim=sgd", "optim.lr=0.5", "optim.momentum=0.9", "pipeline.schedule=gpipe", "pipeline.microbatches=2"],
        [
            "optim=adam",
            "optim.lr=0.05",
            "pipeline.schedule=1f1b",
            "pipeline.microbatches=4",
            "optim.clip_global_norm=0.01",
        ],
        # zb1: W from each weighted layer's kept output, the tied read-out's use of the matrix included
        ["optim=adam", "optim.lr=0.05", "pipeline.schedule=zb1", "pipeline.microbatches=2"],
    ],
    ids=["gpipe-sgd-M2", "1f1b-adam-M4-clipped", "zb1-adam-M2"],
)
def test_a_tied_embedding_cut_across_stages_trains_like_the_uncut_model(overrides):
    run = chain.build(chain.compose(["mode=e2e", *RUN, *overrides]), model=tied_embedding_model())
    copies = [v for s in run.stages for v in s.trainable_variables if v.path == "embed/embeddings"]
    assert [len(s.shared) for s in run.stages] == [1, 1] and len(copies) == 2  # one copy per stage ...
    assert [canonical(c.value.device) for c in copies] == [s.device for s in run.stages]  # ... on its device
    trains_like_the_uncut_model(run)
    np.testing.assert_array_equal(copies[0].numpy(), copies[1].numpy())  # the copies stay identical


def trains_like_the_uncut_model(run) -> None:
    """3 steps of `run` against Keras' `train_on_batch` of the uncut model (its optimizer, clipping by the
    global norm that triggers when the run clips): each loss and every stage's weight within 1e-5, the
    tied weight moved by training."""
    reference = tied_embedding_model()
    clip = run.settings.stages[0].optim.clip_global_norm  # the tied weight counts once in the global norm
    config = {**run.stages[0].optimizer.get_config(), "global_clipnorm": clip}
    reference.compile(
        optimizer=type(run.stages[0].optimizer).from_config(config),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        jit_compile=False,
    )
    start = {v.path: v.numpy() for v in reference.trainable_variables}
    rng = np.random.default_rng(0)
    for _ in range(3):
        x = rng.integers(0, 4, (16, 6)).astype("float32")
        y = rng.integers(0, 4, 16).astype("int32")
        got = run.step(x, {"label": y})
        np.testing.assert_allclose(got["loss"], reference.train_on_batch(x, y), rtol=RTOL)
        assert clip is None or got["grad_norm"] > clip  # the clipping triggers
    want = {v.path: v.numpy() for v in reference.trainable_variables}
    for s in run.stages:
        for v in s.trainable_variables:
            assert rel_diff(v.numpy(), want[v.path]) <= RTOL, v.path
    assert rel_diff(want["embed/embeddings"], start["embed/embeddings"]) > 100 * RTOL  # training moved it


COPIES = {"replicas": ["placement.replicas=2"], "mirrored": ["placement.fallback=mirrored"]}


@pytest.mark.parametrize(
    "optim",
    [
        ["optim=sgd", "optim.lr=0.5", "optim.momentum=0.9"],
        ["optim=adam", "optim.lr=0.05", "optim.clip_global_norm=0.01"],
    ],
    ids=["sgd", "adam-clipped"],
)
@pytest.mark.parametrize("copies", list(COPIES))
def test_a_tied_embedding_trains_like_the_uncut_model_with_copies_of_the_pipeline_and_mirrored(copies, optim):
    """2 copies of the 2-stage pipeline (4 devices: each copy sums its holders' gradients, the sum averaged
    across the copies once), and the mirrored fallback (the holders' all-reduced gradients summed): 3 steps
    equal Keras on one device, every holder of every copy (and its slots) one value."""
    run = chain.build(
        chain.compose(["mode=e2e", *RUN, *optim, "pipeline.microbatches=2", *COPIES[copies]]),
        model=tied_embedding_model(),
    )
    pipelines = run.strategy.copies if copies == "replicas" else [run.stages]
    assert len(pipelines) == (2 if copies == "replicas" else 1)
    trains_like_the_uncut_model(run)
    pairs = [tied_copies.pairs(stages) for stages in pipelines]  # per copy: (later holder's, first's) weight, slots
    assert [len(p) for p in pairs] == [3 if "optim=adam" in optim else 2] * len(pipelines)  # momentum, Adam's 2
    for p in pairs:
        for a, b in zip(pairs[0], p, strict=True):  # every holder of every copy: one value
            np.testing.assert_array_equal(a[1].numpy(), b[0].numpy())
            np.testing.assert_array_equal(a[1].numpy(), b[1].numpy())


@tf.custom_gradient
def _nan_gradient(w):
    return tf.identity(w), lambda dy: dy * float("nan")


class NonFiniteGradient(L.Layer):
    """Passes its input through; its own weight's gradient is NaN."""

    def build(self, input_shape):
        self.w = self.add_weight(shape=(), initializer="zeros", name="w")

    def call(self, h):
        return h + 0.0 * _nan_gradient(self.w)


def test_a_holder_whose_own_update_is_dropped_takes_every_other_holder_with_it():
    """The guard judges each stage alone: stage 0's NaN gradient (not the tied weight's) drops its
    update; stage 1 holds a copy of the tied weight, so it skips too, and the copies stay equal."""
    keras.utils.set_random_seed(2)
    x = keras.Input((6,))
    embedding = L.Embedding(4, 8, name="embed")
    h = NonFiniteGradient(name="poison")(L.GlobalAveragePooling1D(name="pool")(embedding(x)))
    model = keras.Model(x, TiedReadout(embedding, name="tied")(L.Dense(8, activation="tanh", name="mix")(h)))
    run = chain.build(
        chain.compose(["mode=e2e", *RUN, "optim=sgd", "optim.lr=0.5", "trainer.on_nan=skip", "placement.split=[3,2]"]),
        model=model,
    )
    copies = [v for s in run.stages for v in s.trainable_variables if v.path == "embed/embeddings"]
    x = np.random.default_rng(0).integers(0, 4, (16, 6)).astype("float32")
    run.step(x, {"label": np.arange(16, dtype="int32") % 4})
    assert [int(s.skipped.numpy()) for s in run.stages] == [1, 1]
    np.testing.assert_array_equal(copies[0].numpy(), copies[1].numpy())


def test_a_tied_weight_across_stages_is_refused_in_one_line_where_the_step_does_not_sum_it():
    with pytest.raises(ConfigError) as e:
        chain.build(chain.compose(["mode=local", *RUN]), model=tied_embedding_model())
    assert str(e.value) == (
        "stages 0 and 1 both use the weight 'embed/embeddings' (a tied weight of the cut model); only mode=e2e (its "
        "pipeline, copies of it, or the mirrored fallback) sums its copies' gradients, not DevicePerStageLocal: "
        "use mode=e2e, or cut the model so one stage holds every layer using it"
    )


def test_a_layer_two_stage_builders_share_is_refused_in_one_line():
    shared = L.Dense(6, name="shared")

    def first(input_shape):
        return [shared]

    def second(input_shape):
        return [shared, L.Dense(4)]

    with pytest.raises(ConfigError) as e:
        chain.build(chain.compose(["mode=e2e", *RUN]), stages=[first, second])
    assert (
        str(e.value).startswith("stage 1 (")
        and "uses the variable 'stage_00/shared/kernel' of stage 0; a weight shared by two stages is not supported yet"
        in str(e.value)
    )
    assert "\n" not in str(e.value)


def test_a_checkpoint_and_the_export_hold_a_tied_weight_once_and_resume_is_bit_exact(tmp_path, monkeypatch):
    """The later copy (and its Adam slots) is not saved; a restore gives it the first holder's values.
    A run stopped and resumed from a checkpoint written before (every copy saved) equals the
    uninterrupted one bit for bit. chain.keras is the user's model, the weight once, loaded by
    plain Keras and predicting what the chain predicts."""
    base = [
        "mode=e2e",
        *RUN,
        "optim=adam",
        "optim.lr=0.05",
        "pipeline.microbatches=2",
        "checkpoint.every=2",
        "data.val_fraction=0",
        "trainer.steps_per_call=1",
    ]

    def fit(run_dir, steps, *more):
        run = chain.build(
            chain.compose([*base, f"trainer.steps={steps}", *more]),
            run_dir=str(run_dir),
            model=tied_embedding_model(SavedTiedReadout),
        )
        run.fit()
        return run

    def state(run):
        return [v.numpy() for s in run.stages for v in s.trainable_variables + s.optimizer.variables]

    straight = fit(tmp_path / "straight", 4, "checkpoint.export=true")
    exported = keras.models.load_model(str(tmp_path / "straight" / "chain.keras"))
    assert sorted(v.path for v in exported.weights) == ["embed/embeddings", "mix/bias", "mix/kernel"]
    x = np.random.default_rng(1).integers(0, 4, (8, 6)).astype("float32")
    h = x
    for s in straight.stages:
        h = s.model(h)
    np.testing.assert_allclose(exported.predict(x, verbose=0), h.numpy(), rtol=RTOL)
    embedding = straight.stages[0].trainable_variables[0]
    assert embedding.path == "embed/embeddings"
    held = {
        k: [
            n
            for n, shape in tf.train.list_variables(str(tmp_path / "straight" / f"stage_0{k}" / "ckpt-4"))
            if shape == [4, 8]
        ]
        for k in range(2)
    }
    assert len(held[0]) == 3 and held[1] == []  # the weight and its two slots, once: in the first holder's stage
    reader = tf.train.load_checkpoint(str(tmp_path / "straight" / "stage_00" / "ckpt-4"))
    assert any(np.array_equal(reader.get_tensor(n), embedding.numpy()) for n in held[0])
    want = state(straight)
    for v, _ in tied_copies.pairs(straight.stages):  # the later copy and its slots, scribbled over ...
        v.assign(v + 1.0)
    Checkpoints(str(tmp_path / "straight"), straight.stages, straight.iterator, straight.settings).restore()
    for a, b in zip(state(straight), want, strict=True):  # ... are the saved step again, taken from the first holder
        np.testing.assert_array_equal(a, b)
    with monkeypatch.context() as m:  # a checkpoint as written before: every copy saved
        m.setattr(tied_copies, "leave_out", lambda stages: None)
        fit(tmp_path / "resumed", 2)
    resumed = fit(tmp_path / "resumed", 4, "resume=true")
    for a, b in zip(state(resumed), want, strict=True):
        np.testing.assert_array_equal(a, b)
    copies = [s.trainable_variables[-1] for s in resumed.stages]
    np.testing.assert_array_equal(copies[0].numpy(), copies[1].numpy())


@pytest.mark.parametrize("copies", list(COPIES))
def test_copies_and_mirrored_runs_save_a_tied_weight_once_and_resume_bit_for_bit(tmp_path, copies):
    """Replica 0's first holder alone saves the weight and its Adam slots; 2 steps resumed for 2 more end
    bit for bit where 4 straight steps end, on every holder of every copy."""
    base = [
        "mode=e2e",
        *RUN,
        *COPIES[copies],
        "optim=adam",
        "optim.lr=0.05",
        "pipeline.microbatches=2",
        "checkpoint.every=2",
        "data.val_fraction=0",
        "trainer.steps_per_call=1",
    ]

    def fit(run_dir, steps, *more):
        run = chain.build(
            chain.compose([*base, f"trainer.steps={steps}", *more]), run_dir=str(run_dir), model=tied_embedding_model()
        )
        run.fit()
        pipelines = run.strategy.copies if copies == "replicas" else [run.stages]
        return [
            v.numpy() for stages in pipelines for s in stages for v in s.trainable_variables + s.optimizer.variables
        ]

    straight = fit(tmp_path / "straight", 4)
    held = {
        k: [
            n
            for n, shape in tf.train.list_variables(str(tmp_path / "straight" / f"stage_0{k}" / "ckpt-4"))
            if shape == [4, 8]
        ]
        for k in range(2)
    }
    assert len(held[0]) == 3 and held[1] == []  # the weight and its two slots, once
    fit(tmp_path / "resumed", 2)
    for a, b in zip(fit(tmp_path / "resumed", 4, "resume=true"), straight, strict=True):
        np.testing.assert_array_equal(a, b)


ZBV = [
    "mode=e2e",
    *[o for o in RUN if o != "+stages=2"],
    "+stages=4",
    "pipeline.schedule=zbv",
    "pipeline.microbatches=4",
    "optim=adam",
    "optim.lr=0.05",
    "placement.split=[1,1,1,1]",
]  # zbv: stages 0 and 3 on the first of 2 devices; the split puts pool alone (balancing never leaves a stage weightless)


def test_zbv_puts_the_first_and_last_stage_on_one_device_where_a_tied_weight_is_one_variable(tmp_path):
    """zbv (4 stages on 2 devices, stages 0 and 3 on the first): the tied read-out on stage 3 reads stage
    0's embedding itself, no copy and no exchange; stage 3's gradient joins stage 0's sums, stage 0's
    one optimizer applies it: trains like the uncut model (Keras' fit on one device). The checkpoint holds
    the weight once (stage 0's), and a resumed run is bit for bit the uninterrupted one."""
    base = [*ZBV, "data.val_fraction=0", "checkpoint.every=2", "trainer.steps_per_call=1"]
    run = chain.build(
        chain.compose([*base, "trainer.steps=3"]), run_dir=str(tmp_path / "eq"), model=tied_embedding_model()
    )
    first, last = run.stages[0], run.stages[3]
    assert first.device == last.device and [len(s.borrowed) for s in run.stages] == [0, 0, 0, 1]
    (embedding,) = [v for v in first.trainable_variables if v.path == "embed/embeddings"]
    assert last.borrowed[0].variable is embedding  # one variable, read by both stages
    assert all(v.path != "embed/embeddings" for s in run.stages[1:] for v in s.trainable_variables)
    reference = tied_embedding_model()
    reference.compile(
        optimizer=type(first.optimizer).from_config(first.optimizer.get_config()),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        jit_compile=False,
    )
    start = embedding.numpy()
    rng = np.random.default_rng(0)
    for _ in range(3):
        x = rng.integers(0, 4, (16, 6)).astype("float32")
        y = rng.integers(0, 4, 16).astype("int32")
        np.testing.assert_allclose(run.step(x, {"label": y})["loss"], reference.train_on_batch(x, y), rtol=RTOL)
    want = {v.path: v.numpy() for v in reference.trainable_variables}
    for s in run.stages:
        for v in s.trainable_variables:
            assert rel_diff(v.numpy(), want[v.path]) <= RTOL, v.path
    assert rel_diff(embedding.numpy(), start) > 100 * RTOL  # both stages' uses moved it

    def fit(run_dir, steps, *more):
        r = chain.build(
            chain.compose([*base, f"trainer.steps={steps}", *more]), run_dir=str(run_dir), model=tied_embedding_model()
        )
        r.fit()
        return [v.numpy() for s in r.stages for v in s.trainable_variables + s.optimizer.variables]

    straight = fit(tmp_path / "straight", 4)
    held = {
        k: [
            n
            for n, shape in tf.train.list_variables(str(tmp_path / "straight" / f"stage_0{k}" / "ckpt-4"))
            if shape == [4, 8]
        ]
        for k in range(4)
    }
    assert len(held[0]) == 3 and held[1] == held[2] == held[3] == []  # the weight and its Adam slots, once
    fit(tmp_path / "resumed", 2)
    for a, b in zip(fit(tmp_path / "resumed", 4, "resume=true"), straight, strict=True):
        np.testing.assert_array_equal(a, b)


class Prebuilt(cut.Piece):
    """A placed piece whose model was built already (in an order the test chose): its call returns it."""

    def __init__(self, piece: cut.Piece, model: keras.Model):
        self.__dict__.update(piece.__dict__)
        self.model = model

    def placed(self, holders, index):
        return self

    def __call__(self, input_shape, policy, name):
        return self.model


def stages_built_in_reverse(monkeypatch) -> None:
    """Make `chain.build` build a cut model's stages last first: the pieces placed on their devices, then
    each built in its device scope, from the last to the first, before `build_stages` takes their models."""
    real = base.build_stages

    def build(specs, devices, info, *, bodies, **kw):
        pieces = cut.placed(bodies, devices)
        models = {}
        for k in reversed(range(len(pieces))):
            p = pieces[k]
            shape = tuple(info.input_shape) if p.start == 0 else tuple(p.c.boundary[p.start][0].shape[1:])
            with tf.device(devices[k]):
                models[k] = p(shape, keras.DTypePolicy("float32"), stage_name(k))
        return real(specs, devices, info, bodies=[Prebuilt(p, models[k]) for k, p in enumerate(pieces)], **kw)

    monkeypatch.setattr(base, "build_stages", build)


def what_was_built(run) -> list:
    """Per stage: its layers (class, name), its weights (path, value), its copies of tied weights, and the
    weights it borrows with the stage holding each."""
    holder = {id(v): s.index for s in run.stages for v in s.trainable_variables}
    return [
        [
            [(type(x).__name__, x.name) for x in s.model.layers if not isinstance(x, L.InputLayer)],
            [(v.path, v.numpy().tolist()) for v in s.model.weights],
            [c.name for c in s.shared],
            [(b.name, holder.get(id(b.variable))) for b in s.borrowed],
        ]
        for s in run.stages
    ]


def test_stages_built_last_first_are_the_stages_built_in_order_and_train_like_the_uncut_model(monkeypatch):
    """Building a stage depends only on the cut and its index: zbv's 4 stages on 2 devices built from the last
    to the first have the layers, weights, copies and borrowing of the same stages built in order (stage 3
    borrows stage 0's embedding, one variable), and 3 steps equal Keras' on the uncut model."""
    config = chain.compose(ZBV)
    in_order = what_was_built(chain.build(config, model=tied_embedding_model()))
    stages_built_in_reverse(monkeypatch)
    run = chain.build(config, model=tied_embedding_model())
    assert what_was_built(run) == in_order
    assert [b for *_, b in in_order] == [[], [], [], [("embed/embeddings", 0)]]  # borrowed from stage 0
    trains_like_the_uncut_model(run)


def dense_twice_model() -> keras.Model:
    """One Dense layer called twice (`twice(tanh(twice(before(x))))`, then a head): the cut lists five layers,
    `twice` at 1 and 3."""
    keras.utils.set_random_seed(3)
    x = keras.Input((6,))
    twice = L.Dense(6, activation="tanh", name="twice")
    h = twice(L.Dense(6, name="before")(x))
    h = twice(L.Activation("tanh", name="between")(h))
    return keras.Model(x, L.Dense(4, name="head")(h), name="dense_twice")


@pytest.mark.parametrize("split", [[4, 1], [3, 2]], ids=["both-calls-on-stage-0", "a-call-on-each-stage"])
def test_a_layer_called_twice_is_one_weight_trained_like_keras_whichever_stage_its_calls_are_on(split, tmp_path):
    """Both calls of the shared Dense on one stage (`placement.split=[4,1]`: it is an ordinary layer there, on one
    stage) or one on each (`[3,2]`: a copy per stage, their gradients summed): 3 SGD steps equal Keras'
    `train_on_batch`; the export (the model uncut) holds the layer once and predicts what the chain predicts."""
    run = chain.build(
        chain.compose(
            ["mode=e2e", *RUN, "optim=sgd", "optim.lr=0.5", "pipeline.microbatches=2", f"placement.split={split}"]
        ),
        model=dense_twice_model(),
    )
    holders = [[v.path for v in s.trainable_variables if v.path.startswith("twice/")] for s in run.stages]
    assert holders == (
        [["twice/kernel", "twice/bias"], []] if split == [4, 1] else [["twice/kernel", "twice/bias"]] * 2
    )
    reference = dense_twice_model()
    reference.compile(
        optimizer=keras.optimizers.SGD(0.5),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        jit_compile=False,
    )
    start = reference.get_layer("twice").kernel.numpy()
    rng = np.random.default_rng(0)
    for _ in range(3):
        x, y = rng.normal(size=(16, 6)).astype("float32"), rng.integers(0, 4, 16).astype("int32")
        np.testing.assert_allclose(run.step(x, {"label": y})["loss"], reference.train_on_batch(x, y), rtol=RTOL)
    want = {v.path: v.numpy() for v in reference.trainable_variables}
    for s in run.stages:
        for v in s.trainable_variables:
            assert rel_diff(v.numpy(), want[v.path]) <= RTOL, v.path
    assert rel_diff(want["twice/kernel"], start) > 100 * RTOL  # training moved it
    from chain.state.export import uncut

    whole = uncut(run.stages)
    assert sorted(v.path for v in whole.weights) == sorted(want)  # the shared layer's weights once
    h = x
    for s in run.stages:
        h = s.model(h)
    np.testing.assert_allclose(whole(x), h, rtol=RTOL)


def test_a_model_inside_the_model_called_twice_is_refused_in_one_line():
    """A layer may be called several times, but a functional model inside the model is cut through (its layers
    become the model's), once: called twice, it is refused naming it."""
    from chain.stages.cut import analyse

    x = keras.Input((6,))
    inner = keras.Model(x, L.Dense(6, name="d")(x), name="inner")
    y = keras.Input((6,))
    with pytest.raises(ConfigError) as e:
        analyse(keras.Model(y, inner(inner(y)), name="outer"), "outer")
    assert str(e.value) == (
        "outer: the model 'inner' inside it is called 2 times; a model cut into stages may call a "
        "layer several times, but a model inside it once (call its layers instead)"
    )
