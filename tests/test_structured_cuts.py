"""Several tensors across a cut: a Keras implicit mask (`Embedding(mask_zero=True)`) crossing with its
tensor, and cuts that several tensors cross. The oracles are Keras' own: `model.predict` on padded
inputs and the same SGD steps of the uncut model on one device."""

from __future__ import annotations

import keras
import numpy as np
import pytest
import tensorflow as tf

import chain
from chain.errors import ConfigError
from compare import assert_trained_like_keras, assert_variables_like, rel_diff, trains_like_one_device
from conftest import DEVICES, EXTENDED

L = keras.layers
SEQ, VOCAB, CLASSES = 6, 20, 4


def masked_encoder() -> keras.Model:
    """A small encoder whose padding (token 0) is masked by the Embedding: attention, the residual,
    the normalization and the average pooling all take the mask Keras attaches to their inputs."""
    keras.utils.set_random_seed(21)
    x = keras.Input((SEQ,))
    e = L.Embedding(VOCAB, 8, mask_zero=True, name="embed")(x)
    a = L.MultiHeadAttention(num_heads=2, key_dim=4, name="mha")(e, e)
    h = L.LayerNormalization(name="ln")(L.Add(name="res")([e, a]))
    h = L.Dense(8, activation="tanh", name="ff")(h)
    h = L.GlobalAveragePooling1D(name="pool")(h)
    return keras.Model(x, L.Dense(CLASSES, name="logits")(h), name="masked")


def padded(path, n=64) -> np.ndarray:
    """Token ids with a random number of padding zeros at the end of every row, saved with labels."""
    rng = np.random.default_rng(3)
    x = rng.integers(1, VOCAB, size=(n, SEQ))
    lengths = rng.integers(2, SEQ + 1, size=n)
    x[np.arange(SEQ)[None, :] >= lengths[:, None]] = 0
    np.savez(path, x=x.astype("float32"), y=rng.integers(0, CLASSES, n))
    return x.astype("float32")


@pytest.mark.parametrize("stages", [2, pytest.param(4, marks=EXTENDED)])  # EXTENDED: suite time; 2 stages every run
def test_an_implicit_mask_crosses_with_its_tensor(tmp_path, stages):
    x = padded(tmp_path / "tokens.npz")
    model = masked_encoder()
    data = [
        "data=npz",
        f"data.path={tmp_path / 'tokens.npz'}",
        "data.y=y",
        "data.batch_size=16",
        "data.shuffle=false",
        "trainer.progress=false",
        "checkpoint.export=false",
    ]
    run = chain.build(
        chain.compose([f"+stages={stages}", "mode=e2e", "optim=sgd", "optim.lr=0.1", "pipeline.microbatches=4", *data]),
        model=model,
    )
    got = run.forward(x[:16])[f"body_{stages - 1}"].numpy()
    np.testing.assert_allclose(got, model.predict(x[:16], verbose=0), rtol=0, atol=1e-6)
    trains_like_one_device(run, masked_encoder(), DEVICES[3], steps=3)


def attention_blocks(h, blocks: int, causal: bool = False):
    """`blocks` of `MultiHeadAttention(h, h)`, the residual `Add` and `LayerNormalization`: when Keras runs them,
    the attention clears the Keras mask of its input, so the residual and every later block carry none."""
    for b in range(blocks):
        a = L.MultiHeadAttention(num_heads=2, key_dim=4, name=f"mha{b}")(h, h, use_causal_mask=causal)
        h = L.LayerNormalization(name=f"ln{b}")(L.Add(name=f"res{b}")([h, a]))
    return h


def masked_blocks(blocks: int, causal: bool = False) -> keras.Model:
    """The issue's hand-written encoder (a decoder's causal attention with `causal`): the Embedding's mask,
    `blocks` attention blocks, an average pooling and the logits."""
    keras.utils.set_random_seed(24)
    x = keras.Input((SEQ,))
    h = attention_blocks(L.Embedding(VOCAB, 8, mask_zero=True, name="embed")(x), blocks, causal)
    h = L.GlobalAveragePooling1D(name="pool")(h)
    return keras.Model(x, L.Dense(CLASSES, name="logits")(h), name=f"{'decoder' if causal else 'encoder'}{blocks}")


def masked_rnns() -> keras.Model:
    """RNNs taking the mask: a GRU before an attention block (the Embedding's mask), an LSTM after it (none,
    as Keras runs it)."""
    keras.utils.set_random_seed(25)
    x = keras.Input((SEQ,))
    h = L.GRU(8, return_sequences=True, name="gru")(L.Embedding(VOCAB, 8, mask_zero=True, name="embed")(x))
    h = L.LSTM(8, name="lstm")(attention_blocks(h, 1))
    return keras.Model(x, L.Dense(CLASSES, name="logits")(h), name="rnns")


MASKED = {
    "encoder3": lambda: masked_blocks(3),
    "encoder2": lambda: masked_blocks(2),
    "decoder2": lambda: masked_blocks(2, causal=True),
    "rnns": masked_rnns,
}


class Oracle:
    """A masked model made once, cut at every split the sweep asks, and Keras' own answers: `model.predict`
    on padded ids and 3 steps of `train_on_batch` (SGD 0.1) from the same start."""

    def __init__(self, name: str, path):
        from chain.stages import cut

        self.model = MASKED[name]()
        self.cuttable = cut.analyse(self.model, name)
        x = padded(path, n=48)
        if "decoder" in name:  # its padding first: a causal attention's real positions then see padded keys
            x = np.ascontiguousarray(x[:, ::-1])
        self.batches = [(x[k : k + 16], np.random.default_rng(k).integers(0, CLASSES, 16)) for k in (0, 16, 32)]
        self.predicted = self.model.predict(x[:16], verbose=0)
        reference = MASKED[name]()
        reference.compile(
            optimizer=keras.optimizers.SGD(0.1),
            jit_compile=False,
            loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        )
        self.start = {v.path: v.numpy() for v in reference.trainable_variables}
        self.losses = [float(reference.train_on_batch(x, y)) for x, y in self.batches]
        self.trained = {v.path: v.numpy() for v in reference.trainable_variables}
        assert rel_diff(self.trained["embed/embeddings"], self.start["embed/embeddings"]) > 1e-3


ORACLES: dict[str, Oracle] = {}


def splits(n_layers: int, stages: int):
    """Every way of cutting `n_layers` layers into `stages` non-empty stages."""
    import itertools

    for cuts in itertools.combinations(range(1, n_layers), stages - 1):
        bounds = [0, *cuts, n_layers]
        yield [b - a for a, b in zip(bounds, bounds[1:])]


@pytest.mark.parametrize(
    "name, stages",
    [
        ("encoder3", 2),
        pytest.param("encoder2", 3, marks=EXTENDED),
        # the suite's time: decoder2's masks cross the cuts every time in the pipeline test below
        pytest.param("decoder2", 2, marks=EXTENDED),
        pytest.param("decoder2", 3, marks=EXTENDED),
        # the suite's time: the attention models' splits run every time, an LSTM reading the mask on a later stage
        # in test_an_implicit_mask_of_a_sequential_crosses_with_its_tensor
        pytest.param("rnns", 2, marks=EXTENDED),
        pytest.param("rnns", 3, marks=EXTENDED),
    ],
)
def test_every_split_masks_as_keras_runs_the_model(tmp_path, name, stages):
    """The stages of every split (2 or 3 stages) of masked models with several attention blocks predict as
    `model.predict` on padded ids: each layer sees the mask it sees when Keras runs the uncut model. 3 SGD steps
    through them equal Keras' `train_on_batch` at every split. Before, a cut between blocks sent the mask the
    graph records after every block, which the model as Keras runs it does not carry (0.9-1.2 off)."""
    from chain.stages import cut

    oracle = ORACLES.get(name) or ORACLES.setdefault(name, Oracle(name, tmp_path / "tokens.npz"))
    c = oracle.cuttable
    for sizes in splits(len(c.layers), stages):
        models, shape = [], c.input_shape
        for k, body in enumerate(cut.pieces(c, sizes)):
            models.append(body(shape, None, f"s{k}"))
            out = models[-1].output_shape
            shape = [tuple(s[1:]) for s in out] if isinstance(out, list) else tuple(out[1:])

        def chained(x, training, models=models):
            for m in models:
                x = m(x, training=training)
            return x

        np.testing.assert_allclose(
            chained(oracle.batches[0][0], False), oracle.predicted, rtol=0, atol=1e-6, err_msg=str(sizes)
        )
        variables = [v for m in models for v in m.trainable_variables]
        optimizer, loss = keras.optimizers.SGD(0.1), keras.losses.SparseCategoricalCrossentropy(from_logits=True)
        for (x, y), want in zip(oracle.batches, oracle.losses):
            with tf.GradientTape() as tape:
                value = loss(y, chained(x, True))
            optimizer.apply_gradients(zip(tape.gradient(value, variables), variables))
            np.testing.assert_allclose(float(value), want, rtol=1e-5, err_msg=str(sizes))
        assert_variables_like(variables, oracle.trained, oracle.start)


def test_a_masked_model_cut_between_attention_blocks_trains_like_keras_in_the_pipeline(tmp_path):
    """The same through chain's pipeline (M=4): `run.forward` equals `model.predict`, `run.step` Keras'
    `train_on_batch`, cut between attention blocks (a stage starts at `mha1`), and between an attention and
    its residual (the embedding, whose mask the attention cleared, crosses with the attention's output)."""
    name, split, stages = "decoder2", "[2,2,5]", 3
    oracle = ORACLES.get(name) or ORACLES.setdefault(name, Oracle(name, tmp_path / "tokens.npz"))
    run = chain.build(
        chain.compose(
            [
                f"+stages={stages}",
                "mode=e2e",
                f"placement.split={split}",
                "optim=sgd",
                "optim.lr=0.1",
                "pipeline.microbatches=4",
                *SYNTH,
            ]
        ),
        model=oracle.model,
    )
    np.testing.assert_allclose(
        run.forward(oracle.batches[0][0])[f"body_{stages - 1}"].numpy(), oracle.predicted, rtol=0, atol=1e-6
    )
    reference = MASKED[name]()
    reference.compile(
        optimizer=keras.optimizers.SGD(0.1),
        jit_compile=False,
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )
    assert_trained_like_keras(run, reference, oracle.batches, oracle.start)


def test_a_cut_keras_would_mask_otherwise_is_refused_in_one_line_and_never_chosen():
    """A Dropout returns its input when Keras runs the model for inference, so the attention clearing its
    output's mask clears the embedding's too, and the residual carries none: across a cut they would be two
    tensors, masked apart. `placement.split` through that cut is one line naming it; balancing cuts elsewhere."""
    from chain.planning.balance import sizes_to_cuts
    from chain.stages import cut

    keras.utils.set_random_seed(26)
    x = keras.Input((SEQ,))
    e = L.Embedding(VOCAB, 8, mask_zero=True, name="embed")(x)
    d = L.Dropout(0.1, name="drop")(e)
    h = L.Add(name="res")([e, L.MultiHeadAttention(num_heads=2, key_dim=4, name="mha")(d, d)])
    model = keras.Model(x, L.Dense(CLASSES, name="logits")(L.GlobalAveragePooling1D(name="pool")(h)), name="aliased")
    c = cut.analyse(model, "aliased")
    assert "'embed'" in c.refused[2] and "'drop'" in c.refused[2] and "are one tensor" in c.refused[2]
    with pytest.raises(ConfigError) as e:
        cut.split(c, 2, [2, 4], "even", None)
    assert str(e.value).startswith("placement.split=[2, 4] cuts aliased before layer 'mha' (layer 2), where ")
    assert "\n" not in str(e.value)
    assert all(2 not in sizes_to_cuts(cut.split(c, k, None, "even", None)) for k in (2, 3))


SYNTH = [
    "data=synthetic",
    "data.features=6",
    "data.classes=4",
    "data.samples=256",
    "data.batch_size=16",
    "trainer.progress=false",
    "checkpoint.export=false",
    "optim=sgd",
    "optim.lr=0.1",
]


def with_a_weightless_layer() -> keras.Model:
    keras.utils.set_random_seed(5)
    x = keras.Input((6,))
    h = L.Dense(8, activation="tanh", name="d0")(x)
    h = L.Dense(8, name="d1")(h)
    h = L.Activation("relu", name="act")(h)
    return keras.Model(x, L.Dense(4, name="out")(h), name="weightless")


@pytest.mark.parametrize("how", ["even", "params"])
def test_balancing_never_leaves_a_stage_without_weights(how):
    from chain.stages import cut

    c = cut.analyse(with_a_weightless_layer(), "weightless")
    assert cut.split(c, 3, None, how, None) == [1, 1, 2]  # 'act' goes with 'd1' or 'out', never alone
    with pytest.raises(chain.ConfigError, match="cannot be cut into 4 stages that each hold weights: 3 of its 4"):
        cut.split(c, 4, None, how, None)


def test_an_explicit_split_with_a_stage_without_weights_trains_like_the_model():
    model = with_a_weightless_layer()
    run = chain.build(
        chain.compose(["+stages=4", "mode=e2e", "placement.split=[1,1,1,1]", "pipeline.microbatches=2", *SYNTH]),
        model=model,
    )
    assert run.stages[2].model.trainable_variables == []
    x, _ = next(iter(run.batches()))
    np.testing.assert_allclose(run.forward(x)["body_3"].numpy(), model.predict(x, verbose=0), rtol=0, atol=1e-6)
    trains_like_one_device(run, with_a_weightless_layer(), DEVICES[3], steps=3)


def with_ops() -> keras.Model:
    """A sequence model whose graph holds ops that are not layers: `x * c` and `x[:, -1, :]`
    (as keras_hub's BERT and Gemma graphs do)."""
    keras.utils.set_random_seed(6)
    x = keras.Input((SEQ, 3))
    h = L.Dense(8, activation="tanh", name="d0")(x) * 0.5
    h = L.Dense(8, activation="tanh", name="d1")(h)
    h = L.Dense(8, name="d2")(h)[:, -1, :]
    return keras.Model(x, L.Dense(CLASSES, name="out")(h), name="ops")


@pytest.mark.parametrize("split", ["[1,3]", "[2,2]", "[3,1]"])
def test_ops_that_are_not_layers_stay_in_their_stage(tmp_path, split):
    x = np.random.default_rng(0).normal(size=(64, SEQ, 3)).astype("float32")
    np.savez(tmp_path / "seq.npz", x=x, y=np.random.default_rng(1).integers(0, CLASSES, 64))
    model = with_ops()
    data = [
        "data=npz",
        f"data.path={tmp_path / 'seq.npz'}",
        "data.y=y",
        "data.batch_size=16",
        "data.shuffle=false",
        "trainer.progress=false",
        "checkpoint.export=false",
        "optim=sgd",
        "optim.lr=0.1",
    ]
    run = chain.build(
        chain.compose(["+stages=2", "mode=e2e", f"placement.split={split}", "pipeline.microbatches=2", *data]),
        model=model,
    )
    np.testing.assert_allclose(
        run.forward(x[:16])["body_1"].numpy(), model.predict(x[:16], verbose=0), rtol=0, atol=1e-6
    )
    trains_like_one_device(run, with_ops(), DEVICES[3], steps=3)


def padding_mask_encoder(blocks: int = 3) -> keras.Model:
    """Two named inputs, as keras_hub's backbones take: token ids and an explicit padding mask that
    every attention block reads (so the mask crosses every cut between blocks with the activations)."""
    keras.utils.set_random_seed(22)
    ids = keras.Input((SEQ,), dtype="int32", name="token_ids")
    pad = keras.Input((SEQ,), dtype="int32", name="padding_mask")
    mask = keras.ops.cast(pad, "bool")
    h = L.Embedding(VOCAB, 8, name="embed")(ids)
    for b in range(blocks):
        a = L.MultiHeadAttention(num_heads=2, key_dim=4, name=f"mha{b}")(h, h, query_mask=mask, value_mask=mask)
        h = L.LayerNormalization(name=f"ln{b}")(L.Add(name=f"res{b}")([h, a]))
    h = L.GlobalAveragePooling1D(name="pool")(h, mask=mask)
    return keras.Model({"token_ids": ids, "padding_mask": pad}, L.Dense(CLASSES, name="logits")(h), name="padded")


def token_batches(n_batches: int, batch: int = 16):
    rng = np.random.default_rng(4)
    out = []
    for _ in range(n_batches):
        ids = rng.integers(1, VOCAB, size=(batch, SEQ)).astype("int32")
        pad = (np.arange(SEQ)[None, :] < rng.integers(2, SEQ + 1, size=batch)[:, None]).astype("int32")
        out.append(({"token_ids": ids * pad, "padding_mask": pad}, {"label": rng.integers(0, CLASSES, batch)}))
    return out


@pytest.mark.parametrize(
    "stages, schedule",
    # the suite's time: gpipe on 2 stages and zbv on 4 run every time
    [(2, "gpipe"), pytest.param(4, "1f1b", marks=EXTENDED), pytest.param(2, "zb1", marks=EXTENDED), (4, "zbv")],
)
def test_a_model_with_named_inputs_and_a_padding_mask_is_cut_between_blocks(stages, schedule):
    model = padding_mask_encoder()
    run = chain.build(
        chain.compose(
            [f"+stages={stages}", "mode=e2e", f"pipeline.schedule={schedule}", "pipeline.microbatches=4", *SYNTH]
        ),
        model=model,
    )
    assert len(run.stages) == stages
    assert any(len(s.model.inputs) > 1 for s in run.stages[1:])  # the mask crosses with the activations
    batches = token_batches(3)
    x = batches[0][0]
    np.testing.assert_allclose(
        run.forward(x)[f"body_{stages - 1}"].numpy(), model.predict(x, verbose=0), rtol=0, atol=1e-6
    )
    trains_like_one_device(run, padding_mask_encoder(), DEVICES[3], steps=3, batches=batches)


def test_a_split_backward_of_attention_blocks_runs_no_product_twice():
    """zb1's W starts from each weighted layer's kept output: for a layer that holds layers with weights (an
    attention block) that would be its whole backward again. B takes such a stage's weight gradients too and W
    only adds them to the sums: no matrix product in W (the padded zb1 and zbv cases above check the values)."""
    from chain.schedule.schedules import Action
    from graph_audit import live_ops

    cfg = chain.compose(["+stages=2", "mode=e2e", "pipeline.schedule=zb1", "pipeline.microbatches=2", *SYNTH])
    x, ys = token_batches(1)[0]
    ops = chain.build(cfg, model=padding_mask_encoder(2)).trace(x, ys).graph.get_operations()
    alive = live_ops(ops[0].graph)
    kinds = [
        Action.parse(op.name).kind
        for op in ops
        if op.type in ("MatMul", "BatchMatMulV2", "Einsum") and op.name in alive and Action.parse(op.name)
    ]
    assert kinds.count("B") > kinds.count("F") > 0 and kinds.count("W") == 0, {k: kinds.count(k) for k in "FBW"}


def masked_sequential() -> keras.Model:
    """The mask only implicit: a Sequential passes it from layer to layer at run time (no op in its graph)."""
    keras.utils.set_random_seed(23)
    return keras.Sequential(
        [
            keras.Input((SEQ,)),
            L.Embedding(VOCAB, 8, mask_zero=True, name="embed"),
            L.LSTM(8, return_sequences=True, name="lstm"),
            L.Dense(8, activation="tanh", name="ff"),
            L.GlobalAveragePooling1D(name="pool"),
            L.Dense(CLASSES, name="logits"),
        ],
        name="seqmask",
    )


def test_an_implicit_mask_of_a_sequential_crosses_with_its_tensor(tmp_path):
    """An LSTM and an average pooling that read the mask on later stages (before: refused, the mask's own
    ops read as tensors no layer makes)."""
    x = padded(tmp_path / "tokens.npz")
    model = masked_sequential()
    data = [
        "data=npz",
        f"data.path={tmp_path / 'tokens.npz'}",
        "data.y=y",
        "data.batch_size=16",
        "data.shuffle=false",
        "trainer.progress=false",
        "checkpoint.export=false",
    ]
    run = chain.build(
        chain.compose(
            [
                "+stages=3",
                "mode=e2e",
                "optim=sgd",
                "optim.lr=0.1",
                "placement.split=[1,2,2]",
                "pipeline.microbatches=4",
                *data,
            ]
        ),
        model=model,
    )
    np.testing.assert_allclose(
        run.forward(x[:16])["body_2"].numpy(), model.predict(x[:16], verbose=0), rtol=0, atol=1e-6
    )
    trains_like_one_device(run, masked_sequential(), DEVICES[3], steps=3)


def test_balance_by_time_times_a_model_with_named_inputs_and_a_mask():
    """Before: refused (`placement.balance=time times pieces that take one tensor`). Its first piece now takes
    the model's dict (ids within its Embedding's vocabulary, a padding mask of ones), each later piece what the
    one before gives; the split follows the measured times."""
    run = chain.build(
        chain.compose(["+stages=2", "mode=e2e", "placement.balance=time", *SYNTH]), model=padding_mask_encoder()
    )
    notes = run.assignment.notes
    assert any(n.startswith("placement.balance=time: split ") and " ms per microbatch" in n for n in notes)
