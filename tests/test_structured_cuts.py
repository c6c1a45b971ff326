"""Several tensors across a cut: a Keras implicit mask (`Embedding(mask_zero=True)`) crossing with its
tensor, and cuts that several tensors cross. The oracles are Keras' own: `model.predict` on padded
inputs and the same SGD steps of the uncut model on one device."""

from __future__ import annotations

import keras
import numpy as np
import pytest

import chain
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
