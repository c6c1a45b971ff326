"""keras_hub models as shipped (tiny configs, random weights, no download) cut into stages: their dict
inputs with padding masks, their graphs' ops, the backbone nested in the task model, and the tied
embedding the keras_hub way (`token_embedding(x, reverse=True)`, the same layer called on the first and
last stage). Oracles: `model.predict` on padded inputs, and Keras' own `train_on_batch` (SGD)."""

from __future__ import annotations

import keras
import keras_hub  # the `lm` extra and keras-hub without its dependencies (README's test command)
import numpy as np
import pytest

import chain
from compare import rel_diff

VOCAB, SEQ, BATCH = 50, 8, 16
RUN = ["mode=e2e", "pipeline.microbatches=4", "data=synthetic", "data.features=6", f"data.classes={VOCAB}",
       "data.samples=64", f"data.batch_size={BATCH}", "trainer.progress=false", "checkpoint.export=false",
       "optim=sgd", "optim.lr=0.1"]


def gpt2_lm() -> keras.Model:
    """GPT2CausalLM as shipped: logits per position, `(batch, seq, vocab)`."""
    keras.utils.set_random_seed(1)
    backbone = keras_hub.models.GPT2Backbone(vocabulary_size=VOCAB, num_layers=2, num_heads=2, hidden_dim=8,
                                             intermediate_dim=16, max_sequence_length=SEQ, dropout=0.0)
    return keras_hub.models.GPT2CausalLM(backbone=backbone, preprocessor=None)


def gemma_lm() -> keras.Model:
    """GemmaCausalLM as shipped (its graph scales the embedding by an op, `x * c`)."""
    keras.utils.set_random_seed(3)
    backbone = keras_hub.models.GemmaBackbone(vocabulary_size=VOCAB, num_layers=2, num_query_heads=2,
                                              num_key_value_heads=1, hidden_dim=8, intermediate_dim=16, head_dim=4,
                                              dropout=0.0)
    return keras_hub.models.GemmaCausalLM(backbone=backbone, preprocessor=None)


def llama_lm() -> keras.Model:
    """LlamaCausalLM as shipped: keras_hub 0.32's LlamaTransformerDecoder cannot be re-created from its config
    (`get_config` raises), so its stage reuses the layer object, its variables re-created on the stage's device."""
    keras.utils.set_random_seed(4)
    backbone = keras_hub.models.LlamaBackbone(vocabulary_size=VOCAB, num_layers=2, num_query_heads=2,
                                              num_key_value_heads=1, hidden_dim=8, intermediate_dim=16, dropout=0.0)
    return keras_hub.models.LlamaCausalLM(backbone=backbone, preprocessor=None)


def next_token(make):
    """The causal LM `make()` read at its last position: one label per example."""
    def read_last() -> keras.Model:
        lm = make()
        return keras.Model(lm.input, lm(lm.input)[:, -1, :], name=f"{lm.name}_next_token")
    return read_last


def bert_classifier() -> keras.Model:
    """BertBackbone as shipped (three named inputs, two outputs) with a classifier head on its pooled output."""
    keras.utils.set_random_seed(2)
    backbone = keras_hub.models.BertBackbone(vocabulary_size=VOCAB, num_layers=2, num_heads=2, hidden_dim=8,
                                             intermediate_dim=16, max_sequence_length=SEQ, dropout=0.0)
    pooled = backbone(backbone.input)["pooled_output"]
    return keras.Model(backbone.input, keras.layers.Dense(VOCAB, name="head")(pooled), name="bert_classifier")


# The done-when's models, each read as one label per example: (the model, whether it takes segment ids).
MODELS = {"gpt2": (next_token(gpt2_lm), False), "bert": (bert_classifier, True),
          "gemma": (next_token(gemma_lm), False), "llama": (next_token(llama_lm), False)}


def batches(n: int, segments: bool = False):
    rng = np.random.default_rng(0)
    out = []
    for _ in range(n):
        pad = (np.arange(SEQ)[None, :] < rng.integers(3, SEQ + 1, BATCH)[:, None]).astype("int32")
        ids = rng.integers(1, VOCAB, (BATCH, SEQ)).astype("int32") * pad
        x = {"token_ids": ids, "padding_mask": pad}
        if segments:
            x["segment_ids"] = (np.arange(SEQ)[None, :] >= SEQ // 2).astype("int32") * pad
        out.append((x, rng.integers(0, VOCAB, BATCH).astype("int32")))
    return out


@pytest.mark.parametrize("stages, schedule", [(2, "gpipe"), (4, "1f1b")])
@pytest.mark.parametrize("name", MODELS)
def test_keras_hub_model_cut_between_blocks_predicts_and_trains_like_keras(name, stages, schedule):
    """Each model of issue 36's done-when, as shipped, in 2 stages (GPipe) and 4 (1F1B) at M=4."""
    make, segments = MODELS[name]
    run = predicts_and_trains_like_keras(make, batches(3, segments), stages, schedule, between_blocks(make, stages))
    names = [[layer.name for layer in s.model.layers] for s in run.stages]
    blocks = [[n for n in stage if n.startswith(BLOCKS)] for stage in names]
    assert sum(map(len, blocks)) == 2 and max(map(len, blocks)) == 1  # the two blocks on two stages: cut between them
    if name != "bert":  # the tied read-out (`token_embedding(x, reverse=True)`) on the last stage
        assert "token_embedding" in names[0] and names[-1][-1] == "token_embedding"
    if name == "llama":
        from chain.planning.devices import canonical

        for s in run.stages:  # the reused blocks' variables live on their stage's device
            assert {canonical(v.value.device) for v in s.model.weights} == {canonical(s.device)}


BLOCKS = ("transformer_layer_", "decoder_block_")  # the transformer blocks' names in these models


def between_blocks(make, stages: int) -> list[str]:
    """2 stages: `placement.split` cutting between the two transformer blocks (`even` keeps both on stage 0,
    the cut after them being the one where a single tensor crosses); 4 stages: `even` cuts between them."""
    if stages != 2:
        return []
    from chain.stages.cut import analyse

    layers = [layer.name for layer in analyse(make(), "model").layers]
    first = [i for i, n in enumerate(layers) if n.startswith(BLOCKS)][1]
    return [f"placement.split=[{first},{len(layers) - first}]"]


def predicts_and_trains_like_keras(make, data, stages: int, schedule: str, overrides=()):
    """`make()` cut into `stages` under `schedule`: predictions equal `model.predict` on padded inputs, and
    3 SGD steps equal Keras' own `train_on_batch` (losses and every weight within 1e-5); returns the run."""
    model = make()
    run = chain.build(chain.compose([f"+stages={stages}", f"pipeline.schedule={schedule}", *RUN, *overrides]),
                      model=model)
    x = data[0][0]
    np.testing.assert_allclose(run.forward(x)[f"body_{stages - 1}"].numpy(), model.predict(x, verbose=0),
                               rtol=0, atol=1e-6)
    reference = make()
    reference.compile(optimizer=keras.optimizers.SGD(0.1),
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True), jit_compile=False)
    start = {v.path: v.numpy() for v in reference.trainable_variables}
    for x, y in data:
        np.testing.assert_allclose(run.step(x, {"label": y})["loss"], reference.train_on_batch(x, y), rtol=1e-5)
    want = {v.path: v.numpy() for v in reference.trainable_variables}
    seen = set()
    for s in run.stages:
        for v in s.trainable_variables:
            seen.add(v.path)
            if np.abs(want[v.path] - start[v.path]).max() < 1e-8:  # attention's key bias: 0 in exact arithmetic
                assert np.abs(v.numpy() - start[v.path]).max() < 1e-6, v.path
                continue
            assert rel_diff(v.numpy(), want[v.path]) <= 1e-5, v.path
    assert seen == set(want)
    assert rel_diff(want["token_embedding/embeddings"], start["token_embedding/embeddings"]) > 1e-3
    return run
