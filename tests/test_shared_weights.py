"""A weight shared by two layers of a cut model, or by two stages, is refused in one line: never
silently untied (two copies training apart) nor updated twice a step by two stages' optimizers.
(Training such models with one copy per owning stage and summed gradients is not built yet.)"""

from __future__ import annotations

import keras
import pytest

import chain
from chain.errors import ConfigError

L = keras.layers
RUN = ["mode=e2e", "+stages=2", "data=synthetic", "data.features=6", "data.classes=4", "data.samples=64",
       "data.batch_size=16", "trainer.progress=false", "checkpoint.export=false"]


class TiedReadout(L.Layer):
    """Logits from the embedding's own matrix (a tied embedding): it holds the Embedding layer."""

    def __init__(self, embedding=None, **kwargs):
        super().__init__(**kwargs)
        self.embedding = embedding

    def call(self, h):
        return h @ keras.ops.transpose(self.embedding.embeddings)


def tied_embedding_model() -> keras.Model:
    keras.utils.set_random_seed(2)
    x = keras.Input((6,), dtype="int32")
    embedding = L.Embedding(4, 8, name="embed")
    h = L.GlobalAveragePooling1D(name="pool")(embedding(x))
    h = L.Dense(8, activation="tanh", name="mix")(h)
    return keras.Model(x, TiedReadout(embedding, name="tied")(h), name="tied_lm")


def test_a_cut_model_with_a_tied_embedding_is_refused_in_one_line():
    with pytest.raises(ConfigError) as e:
        chain.build(chain.compose(RUN), model=tied_embedding_model())
    assert str(e.value) == (
        "tied_lm: layers 'embed' and 'tied' share the variable 'embed/embeddings' (a tied weight); a model cut into "
        "stages cannot share a weight between layers yet (each layer is re-created on its stage, which would untie "
        "them): untie it, or train the model uncut")


def test_a_layer_two_stage_builders_share_is_refused_in_one_line():
    shared = L.Dense(6, name="shared")

    def first(input_shape):
        return [shared]

    def second(input_shape):
        return [shared, L.Dense(4)]

    with pytest.raises(ConfigError) as e:
        chain.build(chain.compose(RUN), stages=[first, second])
    assert str(e.value).startswith("stage 1 (") and "uses the variable 'stage_00/shared/kernel' of stage 0; a weight shared " \
        "by two stages is not supported yet" in str(e.value)
    assert "\n" not in str(e.value)
