"""`model=gpt`: a decoder-only transformer built from Keras' own layers, as one functional model that
`chain.training.user_bodies` cuts into the chain's stages like a `model=keras` file (`chain.stages.cut`).

Token embedding plus a learned position embedding (an `Embedding` over the positions, which ops on the
ids make inside the graph), `depth` pre-norm blocks (LayerNormalization, causal `MultiHeadAttention`
through `use_causal_mask=True`, a residual; LayerNormalization, a 4x gelu MLP, a residual), a final
LayerNormalization, and the read-out: with `tied` the token embedding's transpose (the same layer called
again, `token_embedding(h, reverse=True)`, as keras_hub's models do; the cut puts a copy of it on the last
stage and sums the copies' gradients), else a Dense layer. Logits (batch, seq_len, vocab) for the
per-token loss.

The one layer of chain's own, `TokenEmbedding` (Keras' `Embedding` that can also read out), is
registered serializable: `keras.models.load_model` re-creates it from an export (`chain.keras`)
once this module is imported (`python -m chain.generate` does).
"""

from __future__ import annotations

import keras
from keras import ops

from chain.config.schema import Gpt
from chain.stages.savable import SegmentMask, SegmentPositions, TokenEmbedding

INIT_STDDEV = 0.02  # GPT-2's initial weights: normal, standard deviation 0.02
NORM_EPSILON = 1e-5


def build(spec: Gpt, input_dtype: str = "int32", any_length: bool = False, packed: bool = False) -> keras.Model:
    """The transformer `spec` describes (its `seq_len` settled: `chain.config.checks.gpt`), taking ids of
    `input_dtype` (int32, or int64 for ids that may not fit it), giving logits (batch, seq_len, vocab).
    `any_length`: examples of any length up to `seq_len` (an Input of length None; length buckets). `packed`:
    windows of several examples (`data.pack`), inputs `{"token_ids", "segment_ids"}`: each token attends only
    within its segment and its position restarts with it."""
    init = keras.initializers.RandomNormal(stddev=INIT_STDDEV)
    width, seq_len = spec.width, spec.seq_len
    ids = keras.Input((None if any_length else seq_len,), dtype=input_dtype, name="token_ids")
    segments = keras.Input((seq_len,), dtype="int32", name="segment_ids") if packed else None
    inputs = {"token_ids": ids, "segment_ids": segments} if packed else ids
    tokens = TokenEmbedding(spec.vocab, width, embeddings_initializer=init, name="token_embedding")
    if packed:
        positions = SegmentPositions(name="segment_positions")(segments)
    else:
        positions = ops.cumsum(ops.ones_like(ids), axis=1) - 1  # 0..seq_len-1 per example: ops, kept on stage 0
    x = keras.layers.Add(name="embeddings")(
        [
            tokens(ids),
            keras.layers.Embedding(seq_len, width, embeddings_initializer=init, name="position_embedding")(positions),
        ]
    )
    if spec.dropout:
        x = keras.layers.Dropout(spec.dropout, name="embeddings_dropout")(x)
    for i in range(spec.depth):
        x = _block(spec, i, x, init, segments)
    x = keras.layers.LayerNormalization(epsilon=NORM_EPSILON, name="final_norm")(x)
    if not spec.tied:
        logits = keras.layers.Dense(spec.vocab, kernel_initializer=init, name="readout")(x)
        return keras.Model(inputs, logits, name="gpt")
    # The read-out calls the token embedding again; a cut model calls each layer once per graph, so the
    # blocks form a backbone and the read-out is the task's, as in keras_hub's causal LMs.
    backbone = keras.Model(inputs, x, name="gpt_backbone")
    return keras.Model(inputs, tokens(backbone(inputs), reverse=True), name="gpt")


def _block(spec: Gpt, i: int, x, init, segments):
    """Block `i`: pre-norm causal attention (within each segment of `segments`, when packed) and a 4x gelu
    MLP, each with its residual."""
    width = spec.width
    mask = SegmentMask(name=f"block_{i}_segment_mask")(segments) if segments is not None else None
    h = keras.layers.LayerNormalization(epsilon=NORM_EPSILON, name=f"block_{i}_attention_norm")(x)
    h = keras.layers.MultiHeadAttention(
        spec.heads, width // spec.heads, dropout=spec.dropout, kernel_initializer=init, name=f"block_{i}_attention"
    )(h, h, attention_mask=mask, use_causal_mask=True)
    if spec.dropout:
        h = keras.layers.Dropout(spec.dropout, name=f"block_{i}_attention_dropout")(h)
    x = keras.layers.Add(name=f"block_{i}_attention_residual")([x, h])
    h = keras.layers.LayerNormalization(epsilon=NORM_EPSILON, name=f"block_{i}_mlp_norm")(x)
    h = keras.layers.Dense(4 * width, activation="gelu", kernel_initializer=init, name=f"block_{i}_mlp_in")(h)
    h = keras.layers.Dense(width, kernel_initializer=init, name=f"block_{i}_mlp_out")(h)
    if spec.dropout:
        h = keras.layers.Dropout(spec.dropout, name=f"block_{i}_mlp_dropout")(h)
    return keras.layers.Add(name=f"block_{i}_mlp_residual")([x, h])
