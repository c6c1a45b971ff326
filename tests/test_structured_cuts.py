"""Several tensors across a cut: a Keras implicit mask (`Embedding(mask_zero=True)`) crossing with its
tensor, and cuts that several tensors cross. The oracles are Keras' own: `model.predict` on padded
inputs and the same SGD steps of the uncut model on one device."""

from __future__ import annotations

import keras
import numpy as np
import pytest

import chain
from chain.errors import ConfigError
from compare import trains_like_one_device
from conftest import DEVICES

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


@pytest.mark.parametrize("stages", [2, 4])
def test_an_implicit_mask_crosses_with_its_tensor(tmp_path, stages):
    x = padded(tmp_path / "tokens.npz")
    model = masked_encoder()
    data = ["data=npz", f"data.path={tmp_path / 'tokens.npz'}", "data.y=y", "data.batch_size=16",
            "data.shuffle=false", "trainer.progress=false", "checkpoint.export=false"]
    run = chain.build(chain.compose([f"+stages={stages}", "mode=e2e", "optim=sgd", "optim.lr=0.1",
                                     "pipeline.microbatches=4", *data]), model=model)
    got = run.forward(x[:16])[f"body_{stages - 1}"].numpy()
    np.testing.assert_allclose(got, model.predict(x[:16], verbose=0), rtol=0, atol=1e-6)
    trains_like_one_device(run, masked_encoder(), DEVICES[3], steps=3)


SYNTH = ["data=synthetic", "data.features=6", "data.classes=4", "data.samples=256", "data.batch_size=16",
         "trainer.progress=false", "checkpoint.export=false", "optim=sgd", "optim.lr=0.1"]


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
    run = chain.build(chain.compose(["+stages=4", "mode=e2e", "placement.split=[1,1,1,1]", "pipeline.microbatches=2",
                                     *SYNTH]), model=model)
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
    data = ["data=npz", f"data.path={tmp_path / 'seq.npz'}", "data.y=y", "data.batch_size=16", "data.shuffle=false",
            "trainer.progress=false", "checkpoint.export=false", "optim=sgd", "optim.lr=0.1"]
    run = chain.build(chain.compose(["+stages=2", "mode=e2e", f"placement.split={split}", "pipeline.microbatches=2",
                                     *data]), model=model)
    np.testing.assert_allclose(run.forward(x[:16])["body_1"].numpy(), model.predict(x[:16], verbose=0),
                               rtol=0, atol=1e-6)
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


@pytest.mark.parametrize("stages, schedule", [(2, "gpipe"), (4, "1f1b"), (2, "zb1"), (4, "zbv")])
def test_a_model_with_named_inputs_and_a_padding_mask_is_cut_between_blocks(stages, schedule):
    model = padding_mask_encoder()
    run = chain.build(chain.compose([f"+stages={stages}", "mode=e2e", f"pipeline.schedule={schedule}",
                                     "pipeline.microbatches=4", *SYNTH]), model=model)
    assert len(run.stages) == stages
    assert any(len(s.model.inputs) > 1 for s in run.stages[1:])  # the mask crosses with the activations
    batches = token_batches(3)
    x = batches[0][0]
    np.testing.assert_allclose(run.forward(x)[f"body_{stages - 1}"].numpy(), model.predict(x, verbose=0),
                               rtol=0, atol=1e-6)
    trains_like_one_device(run, padding_mask_encoder(), DEVICES[3], steps=3, batches=batches)


def masked_sequential() -> keras.Model:
    """The mask only implicit: a Sequential passes it from layer to layer at run time (no op in its graph)."""
    keras.utils.set_random_seed(23)
    return keras.Sequential([keras.Input((SEQ,)), L.Embedding(VOCAB, 8, mask_zero=True, name="embed"),
                             L.LSTM(8, return_sequences=True, name="lstm"), L.Dense(8, activation="tanh", name="ff"),
                             L.GlobalAveragePooling1D(name="pool"), L.Dense(CLASSES, name="logits")], name="seqmask")


def test_an_implicit_mask_of_a_sequential_crosses_with_its_tensor(tmp_path):
    """An LSTM and an average pooling that read the mask on later stages (before: refused, the mask's own
    ops read as tensors no layer makes)."""
    x = padded(tmp_path / "tokens.npz")
    model = masked_sequential()
    data = ["data=npz", f"data.path={tmp_path / 'tokens.npz'}", "data.y=y", "data.batch_size=16",
            "data.shuffle=false", "trainer.progress=false", "checkpoint.export=false"]
    run = chain.build(chain.compose(["+stages=3", "mode=e2e", "optim=sgd", "optim.lr=0.1", "placement.split=[1,2,2]",
                                     "pipeline.microbatches=4", *data]), model=model)
    np.testing.assert_allclose(run.forward(x[:16])["body_2"].numpy(), model.predict(x[:16], verbose=0), rtol=0,
                               atol=1e-6)
    trains_like_one_device(run, masked_sequential(), DEVICES[3], steps=3)


def test_balance_by_time_refuses_a_model_with_several_inputs_in_one_line():
    """Timing feeds each piece one float tensor: a model with named inputs and a mask is refused, naming what to use."""
    with pytest.raises(ConfigError) as e:
        chain.build(chain.compose(["+stages=2", "mode=e2e", "placement.balance=time", *SYNTH]), model=padding_mask_encoder())
    assert str(e.value).startswith("placement.balance=time times pieces that take one tensor") and "\n" not in str(e.value)
