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


def gpt2_next_token() -> keras.Model:
    """GPT2CausalLM as shipped, read at its last position (the per-token loss is another piece of work)."""
    keras.utils.set_random_seed(1)
    backbone = keras_hub.models.GPT2Backbone(vocabulary_size=VOCAB, num_layers=2, num_heads=2, hidden_dim=8,
                                             intermediate_dim=16, max_sequence_length=SEQ, dropout=0.0)
    lm = keras_hub.models.GPT2CausalLM(backbone=backbone, preprocessor=None)
    return keras.Model(lm.input, lm(lm.input)[:, -1, :], name="next_token")


def bert_classifier() -> keras.Model:
    """BertBackbone as shipped (three named inputs, two outputs) with a classifier head on its pooled output."""
    keras.utils.set_random_seed(2)
    backbone = keras_hub.models.BertBackbone(vocabulary_size=VOCAB, num_layers=2, num_heads=2, hidden_dim=8,
                                             intermediate_dim=16, max_sequence_length=SEQ, dropout=0.0)
    pooled = backbone(backbone.input)["pooled_output"]
    return keras.Model(backbone.input, keras.layers.Dense(VOCAB, name="head")(pooled), name="bert_classifier")


def gemma_next_token() -> keras.Model:
    """GemmaCausalLM as shipped (its graph scales the embedding by an op, `x * c`), read at its last position."""
    keras.utils.set_random_seed(3)
    backbone = keras_hub.models.GemmaBackbone(vocabulary_size=VOCAB, num_layers=2, num_query_heads=2,
                                              num_key_value_heads=1, hidden_dim=8, intermediate_dim=16, head_dim=4,
                                              dropout=0.0)
    lm = keras_hub.models.GemmaCausalLM(backbone=backbone, preprocessor=None)
    return keras.Model(lm.input, lm(lm.input)[:, -1, :], name="gemma_next_token")


def llama_next_token() -> keras.Model:
    """LlamaCausalLM as shipped: keras_hub 0.32's LlamaTransformerDecoder cannot be re-created from its config
    (`get_config` raises), so its stage reuses the layer object, its variables re-created on the stage's device."""
    keras.utils.set_random_seed(4)
    backbone = keras_hub.models.LlamaBackbone(vocabulary_size=VOCAB, num_layers=2, num_query_heads=2,
                                              num_key_value_heads=1, hidden_dim=8, intermediate_dim=16, dropout=0.0)
    lm = keras_hub.models.LlamaCausalLM(backbone=backbone, preprocessor=None)
    return keras.Model(lm.input, lm(lm.input)[:, -1, :], name="llama_next_token")


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


@pytest.fixture(scope="module")
def data():
    return batches(3)


@pytest.mark.parametrize("stages, schedule", [(2, "gpipe"), (4, "1f1b")])
def test_gpt2_causal_lm_cut_between_blocks_predicts_and_trains_like_keras(data, stages, schedule):
    run = predicts_and_trains_like_keras(gpt2_next_token, data, stages, schedule)
    names = [[layer.name for layer in s.model.layers] for s in run.stages]
    assert "token_embedding" in names[0] and "token_embedding" in names[-1]  # tied: on the first and last stage


def test_bert_backbone_with_a_classifier_head_cut_in_4_stages_predicts_and_trains_like_keras():
    run = predicts_and_trains_like_keras(bert_classifier, batches(3, segments=True), 4, "1f1b")
    assert any("transformer_layer_0" in [layer.name for layer in s.model.layers] for s in run.stages[1:])


def test_gemma_causal_lm_cut_between_blocks_predicts_and_trains_like_keras(data):
    run = predicts_and_trains_like_keras(gemma_next_token, data, 2, "gpipe")
    assert [layer.name for layer in run.stages[-1].model.layers][-1] == "token_embedding"  # the tied read-out


def test_llama_causal_lm_whose_blocks_have_no_config_is_cut_and_trains_like_keras(data):
    run = predicts_and_trains_like_keras(llama_next_token, data, 2, "1f1b")
    from chain.planning.devices import canonical

    for s in run.stages:  # the reused blocks' variables live on their stage's device
        assert {canonical(v.value.device) for v in s.model.weights} == {canonical(s.device)}


def predicts_and_trains_like_keras(make, data, stages: int, schedule: str):
    """`make()` cut into `stages` under `schedule`: predictions equal `model.predict` on padded inputs, and
    3 SGD steps equal Keras' own `train_on_batch` (losses and every weight within 1e-5); returns the run."""
    model = make()
    run = chain.build(chain.compose([f"+stages={stages}", f"pipeline.schedule={schedule}", *RUN]), model=model)
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



def gpt2_per_token(static: bool) -> keras.Model:
    """GPT2CausalLM as shipped (its `(batch, seq, vocab)` logits); `static`: called on token ids of a fixed
    length, its padding mask all ones (`ops.ones_like`, an op kept on the first stage), the backbone's own
    graph still open in its length (None) inside."""
    keras.utils.set_random_seed(1)
    backbone = keras_hub.models.GPT2Backbone(vocabulary_size=VOCAB, num_layers=2, num_heads=2, hidden_dim=8,
                                             intermediate_dim=16, max_sequence_length=SEQ, dropout=0.0)
    lm = keras_hub.models.GPT2CausalLM(backbone=backbone, preprocessor=None)
    if not static:
        return lm
    ids = keras.Input((SEQ,), dtype="int32", name="token_ids")
    return keras.Model(ids, lm({"token_ids": ids, "padding_mask": keras.ops.ones_like(ids)}), name="gpt2_static")


@pytest.mark.parametrize("static", [False, True], ids=["as-shipped", "static-length"])
def test_gpt2_causal_lm_per_token_cut_between_blocks_trains_like_keras(tmp_path, static):
    """The next token learnt at every position (padding left out, `ignore_class=0`), the model cut between
    its blocks (the hidden states and the padding mask cross): stages built from a graph whose sequence
    length is open (None) take the length the stage before gives, or any. 3 SGD steps equal Keras' own
    `train_on_batch` with the same loss."""
    lm, reference = gpt2_per_token(static), gpt2_per_token(static)
    steps = [(x["token_ids"] if static else x, np.roll(x["token_ids"], -1, axis=1) * x["padding_mask"])
             for x, _ in batches(3)]
    ids = np.arange(VOCAB * SEQ).reshape(VOCAB, SEQ) % VOCAB  # the data set declares the target: SEQ ids of VOCAB
    np.savez(tmp_path / "ids.npz", x=ids, y=ids)
    run = chain.build(chain.compose(["+stages=2", "placement.split=[5,3]", "pipeline.schedule=gpipe", "mode=e2e",
                                     "pipeline.microbatches=4", "data=npz", f"data.path={tmp_path / 'ids.npz'}",
                                     "data.x=x", "data.y=y", f"data.batch_size={BATCH}", "data.val_fraction=0",
                                     "ignore_class=0", "trainer.progress=false", "checkpoint.export=false",
                                     "optim=sgd", "optim.lr=0.1"]), model=lm)
    assert "transformer_layer_1" in [layer.name for layer in run.stages[1].model.layers]
    assert run.stages[-1].model.output_shape == (None, SEQ if static else None, VOCAB)
    reference.compile(optimizer=keras.optimizers.SGD(0.1), jit_compile=False, weighted_metrics=[],  # the loss alone
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True, ignore_class=0))
    start = {v.path: v.numpy() for v in reference.trainable_variables}
    for x, y in steps:
        np.testing.assert_allclose(run.step(x, {"label": y})["loss"], reference.train_on_batch(x, y), rtol=1e-5)
    want = {v.path: v.numpy() for v in reference.trainable_variables}
    for s in run.stages:
        for v in s.trainable_variables:
            if np.abs(want[v.path] - start[v.path]).max() < 1e-8:  # attention's key bias: 0 in exact arithmetic
                continue
            assert rel_diff(v.numpy(), want[v.path]) <= 1e-5, v.path
    assert rel_diff(want["token_embedding/embeddings"], start["token_embedding/embeddings"]) > 1e-3
