"""The keras_hub zoo of tests/test_keras_hub_zoo.py: one tiny-config maker per architecture (keras_hub 0.32,
random weights, no download), each model read as one label per example (a causal LM at its last position, an
encoder by a `head` on its first position or pooled output), with its padded inputs and labels.

`ZOO[name]` is a `Species`: the maker, its batches, the names its transformer blocks begin with (a 2-stage cut
goes between the first two; none: the blocks are one layer, ViT's and DINOv2's encoders, and only 2 stages are
built), and the path of a weight early in the model that 3 steps must move (training reached it)."""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass
from typing import Callable

import keras
import keras_hub
import numpy as np

from test_keras_hub import (
    BATCH,
    RUN,
    SEQ,
    VOCAB,
    albert_classifier,
    bart_lm,
    batches,
    esm2_classifier,
    next_token,
    opt_lm,
    seq2seq_batches,
    shipped,
    t5_lm,
    tiny,
)

EMBEDDING = "token_embedding/embeddings"
NESTED = f"embeddings/{EMBEDDING}"  # the token embedding inside an embedding layer (RoBERTa's, OPT's)
IMAGE = (8, 8, 3)  # 4 patches of 4x4
FRAMES, MELS = 16, 4  # Whisper's encoder features: 16 frames of 4 mel bins (8 positions after its strided conv)


@dataclass(frozen=True)
class Species:
    """One architecture of the zoo: `make()` the model, `data(n)` n padded batches `(x, labels)` of what it
    takes, `blocks` the prefixes of its transformer blocks' names (empty: they are one layer), `moved` the path of
    a weight 3 SGD steps must move, `base` the run's config (None: test_keras_hub's `RUN`), `numbered` a layer
    name Keras numbers (`assert_trained_like_keras`'s)."""

    make: Callable[[], keras.Model]
    data: Callable[[int], list]
    blocks: tuple[str, ...]
    moved: str = EMBEDDING
    base: Callable[[], list[str]] | None = None
    numbered: str = ""


def causal_lm(seed: int, backbone: type, task: type, **config) -> Callable[[], keras.Model]:
    """A causal LM as shipped with 2 blocks, read at its last position."""
    return next_token(lambda: shipped(seed, backbone, task, num_layers=2, **config))


def classifier(seed: int, backbone: type, pooled: bool = False, **config) -> Callable[[], keras.Model]:
    """An encoder backbone with 2 blocks and a classifier `head` on its pooled output (`pooled`) or its first
    position."""

    def make() -> keras.Model:
        keras.utils.set_random_seed(seed)
        body = tiny(backbone, num_layers=2, **config)
        out = body(body.input)
        h = out["pooled_output"] if pooled else out[:, 0, :]
        return keras.Model(body.input, keras.layers.Dense(VOCAB, name="head")(h), name=f"{body.name}_classifier")

    return make


def text(*names: str) -> Callable[[int], list]:
    """test_keras_hub's padded batches (segments in both halves), of the inputs `names` only."""
    return lambda n: [({k: x[k] for k in names}, y) for x, y in batches(n, segments=True)]


PADDED = text("token_ids", "padding_mask")
SEGMENTED = text("token_ids", "segment_ids", "padding_mask")


def whisper() -> keras.Model:
    """WhisperBackbone (its encoder's features, its decoder's ids and padding) with a `head` on the decoder's
    last position."""
    keras.utils.set_random_seed(28)
    body = tiny(
        keras_hub.models.WhisperBackbone,
        num_layers=2,
        num_mels=MELS,
        max_encoder_sequence_length=FRAMES,
        max_decoder_sequence_length=SEQ,
    )
    h = body(body.input)["decoder_sequence_output"][:, -1, :]
    return keras.Model(body.input, keras.layers.Dense(VOCAB, name="head")(h), name="whisper_classifier")


def audio(n: int) -> list:
    """`n` batches of Whisper's inputs: Gaussian features, padded decoder ids."""
    rng = np.random.default_rng(2)
    return [
        (
            {
                "encoder_features": rng.standard_normal((BATCH, FRAMES, MELS)).astype("float32"),
                "decoder_token_ids": x["token_ids"],
                "decoder_padding_mask": x["padding_mask"],
            },
            y,
        )
        for x, y in batches(n)
    ]


def vit() -> keras.Model:
    """ViTImageClassifier as shipped (its class token read by `predictions`)."""
    keras.utils.set_random_seed(29)
    backbone = keras_hub.models.ViTBackbone(
        image_shape=IMAGE, patch_size=4, num_layers=2, num_heads=2, hidden_dim=8, mlp_dim=16
    )
    return keras_hub.models.ViTImageClassifier(backbone=backbone, num_classes=VOCAB, preprocessor=None)


def dinov2() -> keras.Model:
    """DINOV2Backbone (its one input a dict, `{"images"}`) with a `head` on its class token; no mask token (a
    weight only masked inputs read)."""
    keras.utils.set_random_seed(30)
    body = keras_hub.models.DINOV2Backbone(
        patch_size=4,
        num_layers=2,
        hidden_dim=8,
        num_heads=2,
        intermediate_dim=16,
        use_mask_token=False,
        image_shape=IMAGE,
        position_embedding_shape=IMAGE,
    )
    h = body(body.input)[:, 0, :]
    return keras.Model(body.input, keras.layers.Dense(VOCAB, name="head")(h), name="dinov2_classifier")


def images(key: str = "") -> Callable[[int], list]:
    """`n` batches of Gaussian images and labels; `key`: the images in a dict under it."""

    def make(n: int) -> list:
        rng = np.random.default_rng(3)
        out = [
            (rng.standard_normal((BATCH, *IMAGE)).astype("float32"), rng.integers(0, VOCAB, BATCH).astype("int32"))
            for _ in range(n)
        ]
        return [({key: x} if key else x, y) for x, y in out]

    return make


def image_data() -> list[str]:
    """test_keras_hub's `RUN` on `data=npz` images of `IMAGE` (a model of one image input must fit the data's
    examples): the batches are the test's own, the file only describes them."""
    path = os.path.join(tempfile.mkdtemp(prefix="keras_hub_zoo_"), "images.npz")
    np.savez(path, x=np.zeros((4 * BATCH, *IMAGE), "float32"), y=np.arange(4 * BATCH) % VOCAB)
    return [
        *[o for o in RUN if not o.startswith("data")],
        "data=npz",
        f"data.path={path}",
        "data.x=x",
        "data.y=y",
        f"data.batch_size={BATCH}",
        "data.val_fraction=0",
    ]


hub = keras_hub.models
DECODER = ("transformer_layer_",)
SEQ2SEQ = ("transformer_encoder_layer_", "transformer_decoder_layer_")
ZOO: dict[str, Species] = {
    # decoders (causal LMs), each read at its last position
    "mistral": Species(
        causal_lm(
            11,
            hub.MistralBackbone,
            hub.MistralCausalLM,
            num_heads=None,
            num_query_heads=2,
            num_key_value_heads=1,
            sliding_window=4,
        ),
        batches,
        DECODER,
    ),
    "qwen2": Species(
        causal_lm(12, hub.QwenBackbone, hub.QwenCausalLM, num_heads=None, num_query_heads=2, num_key_value_heads=1),
        batches,
        DECODER,
    ),
    "qwen3": Species(
        causal_lm(
            13,
            hub.Qwen3Backbone,
            hub.Qwen3CausalLM,
            num_heads=None,
            num_query_heads=2,
            num_key_value_heads=1,
            head_dim=4,
        ),
        batches,
        DECODER,
    ),
    "phi3": Species(
        causal_lm(14, hub.Phi3Backbone, hub.Phi3CausalLM, num_heads=None, num_query_heads=2, num_key_value_heads=1),
        batches,
        DECODER,
    ),
    "falcon": Species(
        causal_lm(15, hub.FalconBackbone, hub.FalconCausalLM, num_heads=None, dropout=None, num_attention_heads=2),
        batches,
        DECODER,
    ),
    "bloom": Species(causal_lm(16, hub.BloomBackbone, hub.BloomCausalLM), batches, DECODER),
    "gpt_neox": Species(
        causal_lm(17, hub.GPTNeoXBackbone, hub.GPTNeoXCausalLM, rotary_percentage=0.5, max_sequence_length=SEQ),
        batches,
        DECODER,
    ),
    "llama3": Species(
        causal_lm(18, hub.Llama3Backbone, hub.Llama3CausalLM, num_heads=None, num_query_heads=2, num_key_value_heads=1),
        batches,
        DECODER,
    ),
    # SmolLM3's second block without rotary positions (NoPE)
    "smollm3": Species(
        causal_lm(
            19,
            hub.SmolLM3Backbone,
            hub.SmolLM3CausalLM,
            num_heads=None,
            dropout=None,
            num_attention_heads=2,
            num_key_value_heads=1,
            attention_bias=False,
            attention_dropout=0.0,
            rope_layer_enabled_list=[True, False],
            layer_types=["attention"] * 2,
            mlp_bias=False,
            layer_norm_epsilon=1e-5,
            max_position_embeddings=SEQ,
            rope_theta=10000.0,
            partial_rotary_factor=1.0,
        ),
        batches,
        DECODER,
    ),
    # Gemma3 text only (`image_size` unused without a vision encoder), its sliding windows shorter than the
    # sequence, and soft caps small enough to bend its logits
    "gemma3": Species(
        causal_lm(
            20,
            hub.Gemma3Backbone,
            hub.Gemma3CausalLM,
            num_heads=None,
            image_size=IMAGE[0],
            num_query_heads=2,
            num_key_value_heads=1,
            head_dim=4,
            use_sliding_window_attention=True,
            sliding_window_size=4,
            attention_logit_soft_cap=1.0,
            final_logit_soft_cap=1.0,
        ),
        batches,
        ("decoder_block_",),
    ),
    # encoders, each with a classifier head
    "distil_bert": Species(
        classifier(21, hub.DistilBertBackbone, max_sequence_length=SEQ),
        PADDED,
        DECODER,
        f"token_and_position_embedding/{EMBEDDING}",
    ),
    "roberta": Species(classifier(22, hub.RobertaBackbone, max_sequence_length=SEQ), PADDED, DECODER, NESTED),
    "xlm_roberta": Species(classifier(23, hub.XLMRobertaBackbone, max_sequence_length=SEQ), PADDED, DECODER, NESTED),
    "electra": Species(
        classifier(
            24,
            hub.ElectraBackbone,
            pooled=True,
            vocabulary_size=None,
            vocab_size=VOCAB,
            embedding_dim=4,
            max_sequence_length=SEQ,
        ),
        SEGMENTED,
        DECODER,
    ),
    "deberta_v3": Species(
        classifier(25, hub.DebertaV3Backbone, max_sequence_length=SEQ, bucket_size=4),
        PADDED,
        ("disentangled_attention_encoder_layer_",),
    ),
    # F-Net mixes tokens by Fourier transforms: no attention, no padding mask
    "f_net": Species(
        classifier(26, hub.FNetBackbone, pooled=True, num_heads=None, max_sequence_length=SEQ),
        text("token_ids", "segment_ids"),
        ("f_net_layer_",),
    ),
    # RoFormerV2 masks the padding by its ids (0), without a padding mask
    "roformer_v2": Species(
        classifier(27, hub.RoformerV2Backbone, head_size=4), text("token_ids", "segment_ids"), DECODER
    ),
    # an encoder-decoder of audio features, cut between its encoder's blocks
    "whisper": Species(whisper, audio, ("transformer_encoder_layer_",), "encoder_token_embedding_conv_layer_1/kernel"),
    # vision: the encoder's blocks are one layer
    "vit": Species(vit, images(), (), "vit_patching_and_embedding/patch_embedding/kernel", image_data),
    "dinov2": Species(dinov2, images("images"), (), "embeddings/patch_embeddings/projection/kernel", image_data),
    # test_keras_hub's models of shared weights (there in 2 stages at M=1) and ESM2 (its one-key dict)
    "opt": Species(next_token(opt_lm), batches, DECODER, NESTED),
    "bart": Species(next_token(bart_lm), seq2seq_batches, SEQ2SEQ),
    "t5": Species(next_token(t5_lm), seq2seq_batches, SEQ2SEQ, numbered="t5_layer_norm"),
    "albert": Species(albert_classifier, SEGMENTED, ("group_0_inner_layer_0",)),
    "esm2": Species(esm2_classifier, text("token_ids"), DECODER),
}
