"""Integer inputs (token ids) stay integers from the file to the model: float32 holds whole numbers
exactly only up to 2^24, so an id of 2^24 + 1 would arrive as 2^24. Checked on the batches each
source gives and on what a model with an integer `Input` computes (against `model.predict`)."""

from __future__ import annotations

import keras
import numpy as np
import pytest
import tensorflow as tf

import chain

BIG = 2**24 + 1  # the first integer float32 cannot hold
N, SEQ = 16, 4


def ids() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(2)
    x = rng.integers(0, 5, (N, SEQ)).astype(np.int64)
    x[:, 0] = BIG + np.arange(N)  # odd and even ids above 2^24
    return x, (x[:, 0] % 2).astype(np.int64)


@keras.saving.register_keras_serializable(package="test_token_ids")
class Parity(keras.layers.Layer):
    """Each id modulo 2, as a float: what a model can only get right from exact ids."""

    def call(self, x):
        return tf.cast(tf.math.floormod(x, 2), "float32")


def parity_model() -> keras.Model:
    keras.utils.set_random_seed(3)
    return keras.Sequential(
        [keras.Input((SEQ,), dtype="int64"), Parity(), keras.layers.Dense(3, activation="tanh"), keras.layers.Dense(2)],
        name="ids",
    )


SMALL = [
    "mode=e2e",
    "+stages=2",
    "placement.split=[2,1]",
    "data.batch_size=8",
    "data.val_fraction=0",
    "trainer.progress=false",
    "checkpoint.export=false",
    "optim=sgd",
]


def sources(tmp_path) -> dict[str, list[str]]:
    x, y = ids()
    np.savez(tmp_path / "ids.npz", x=x, y=y)
    with tf.io.TFRecordWriter(str(tmp_path / "ids.tfrecord")) as w:
        for xi, yi in zip(x, y):
            feature = {
                "tokens": tf.train.Feature(int64_list=tf.train.Int64List(value=xi.tolist())),
                "label": tf.train.Feature(int64_list=tf.train.Int64List(value=[int(yi)])),
            }
            w.write(tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString())
    npz = ["data=npz", f"data.path={tmp_path / 'ids.npz'}", "data.x=x", "data.y=y"]
    records = [
        "data=tfrecord",
        f"data.path={tmp_path / 'ids.tfrecord'}",
        "data.x=tokens",
        "data.y=label",
        f"data.features={{tokens: 'int64[{SEQ}]', label: int64}}",
    ]
    return {
        "npz": npz,
        "npz-stream": [*npz, "data.stream=true", "data.classes={label: 2}"],
        "tfrecord": records,
        "tfrecord-stream": [*records, "data.stream=true", "data.classes={label: 2}"],
    }


@pytest.mark.parametrize("source", ["npz", "npz-stream", "tfrecord", "tfrecord-stream"])
def test_ids_above_2_to_the_24_reach_the_model_exactly(tmp_path, source):
    """Every batch holds the file's ids as integers, and the chain's prediction on them (cut into two
    stages) equals `model.predict`, which a model fed 2^24 for 2^24 + 1 would not."""
    x, _ = ids()
    m = parity_model()
    want = m.predict(x, verbose=0)
    run = chain.build(chain.compose([*SMALL, *sources(tmp_path)[source]]), model=m)
    seen = set()
    it = iter(run.batches())
    for _ in range(2):
        bx, _ = next(it)
        assert np.asarray(bx).dtype.kind == "i"
        seen |= set(np.asarray(bx)[:, 0].tolist())
    # Ids of the file, exact: an odd id above 2^24 would arrive rounded to an even one, not in the file.
    assert seen <= set(x[:, 0].tolist()) and any(i % 2 for i in seen)
    # Equal to float rounding (two graphs against predict's one); a wrong parity moves a logit by O(1).
    np.testing.assert_allclose(run.forward(x)["body_1"], want, rtol=1e-5, atol=1e-6)
    run.step(*next(it))  # and it trains on them
