"""Per-token losses: a model that outputs logits per position `(batch, seq, vocab)` learns integer
labels per position `(batch, seq)`, and `ignore_class=P` leaves padding out of the loss.

The oracle is Keras itself: `model.fit` of the uncut model with
`SparseCategoricalCrossentropy(from_logits=True, ignore_class=P)`, whose loss is the mean over the
batch's real tokens. The batches are built so that the microbatches hold different numbers of real
tokens: a mean of the microbatches' means would differ (checked), the chain's must not.
"""

from __future__ import annotations

import keras
import numpy as np
import pytest

import chain
from compare import rel_diff
from conftest import EXTENDED

N, SEQ, VOCAB, BATCH, PAD = 24, 8, 11, 8, 0
STEPS = 3
RTOL = 1e-5
# Real tokens per example: every batch of 8 (as the stream takes them, in order) holds microbatches of
# very different lengths (M=4: 2 examples each; M=2: 4 each).
LENGTHS = [8, 7, 1, 1, 5, 8, 2, 3] * 3


def token_data(path) -> tuple[np.ndarray, np.ndarray]:
    """Inputs and next-token labels, padded with PAD after each example's length."""
    rng = np.random.default_rng(3)
    x = rng.integers(1, VOCAB, (N, SEQ)).astype(np.int32)
    y = rng.integers(1, VOCAB, (N, SEQ)).astype(np.int32)
    for i, n in enumerate(LENGTHS):
        x[i, n:] = PAD
        y[i, n:] = PAD
    np.savez(path, x=x, y=y)
    return x, y


def model() -> keras.Model:
    """Embedding -> Dense -> Dense(vocab), applied per position: cut 1 + 2."""
    keras.utils.set_random_seed(7)
    return keras.Sequential(
        [
            keras.Input((SEQ,)),
            keras.layers.Embedding(VOCAB, 4),
            keras.layers.Dense(6, activation="tanh"),
            keras.layers.Dense(VOCAB),
        ],
        name="tokens",
    )


def config(path, *overrides: str):
    return chain.compose(
        [
            "mode=e2e",
            "data=npz",
            f"data.path={path}",
            "data.x=x",
            "data.y=y",
            f"data.batch_size={BATCH}",
            "data.val_fraction=0",
            "optim=sgd",
            "optim.lr=0.5",
            f"ignore_class={PAD}",
            "trainer.progress=false",
            "checkpoint.export=false",
            *overrides,
        ]
    )


def keras_loss():
    return keras.losses.SparseCategoricalCrossentropy(from_logits=True, ignore_class=PAD)


def in_order(run, steps: int) -> list:
    it = iter(run.batches())
    return [next(it) for _ in range(steps)]


@pytest.mark.parametrize(
    "overrides",
    [
        ["+stages=2", "pipeline.microbatches=4", "pipeline.schedule=gpipe"],
        # the suite's time: gpipe and zb1 weigh the same unequal microbatches every time, recompute and XLA
        # change how a step computes, not what (test_recompute, test_xla)
        pytest.param(["+stages=2", "pipeline.microbatches=4", "pipeline.schedule=1f1b"], marks=EXTENDED),
        ["+stages=2", "pipeline.microbatches=2", "trainer.grad_accum=2"],
        ["+stages=3", "pipeline.microbatches=4", "pipeline.schedule=zb1"],
        pytest.param(["+stages=2", "pipeline.microbatches=4", "pipeline.recompute=always"], marks=EXTENDED),
        ["+stages=1", "pipeline.microbatches=4"],
        pytest.param(["+stages=2", "pipeline.microbatches=4", "trainer.jit_compile=true"], marks=EXTENDED),
        ["+stages=2", "pipeline.microbatches=2", "placement.replicas=2"],
        ["+stages=2", "placement.fallback=mirrored", "placement.devices=null", "placement.replicas=2"],
    ],
    ids=[
        "gpipe-M4",
        "1f1b-M4",
        "M2-accum2",
        "zb1-K3-M4",
        "recompute-M4",
        "one-stage-M4",
        "xla-M4",
        "replicas2-M2",
        "mirrored2",
    ],
)
def test_per_token_loss_with_padding_trains_like_model_fit(tmp_path, overrides):
    """The logged losses and the weights after 3 SGD steps equal `model.fit` with Keras' own
    `ignore_class` loss on the same batches, though the microbatches hold unequal real tokens."""
    path = tmp_path / "tokens.npz"
    token_data(path)
    m = model()
    reference = keras.models.clone_model(m)
    reference.set_weights(m.get_weights())
    run = chain.build(config(path, *overrides), model=m)
    batches = in_order(run, STEPS)
    x = np.concatenate([np.asarray(b[0]) for b in batches])
    y = np.concatenate([np.asarray(b[1]["label"]) for b in batches])
    real = (y != PAD).reshape(STEPS, -1, SEQ).sum(-1)  # per example
    micro = (
        2
        if "pipeline.microbatches=4" in overrides
        or "pipeline.microbatches=2" in overrides
        and "placement.replicas=2" in overrides
        else 4
    )  # examples per microbatch (a mirrored replica's share: 4)
    assert len({int(c.sum()) for c in real[0].reshape(-1, micro)}) > 1  # the microbatches differ

    losses = [float(run.step(bx, by)["loss"]) for bx, by in batches]
    start = [w.numpy() for w in reference.trainable_variables]
    reference.compile(optimizer=keras.optimizers.SGD(0.5), loss=keras_loss(), jit_compile=False)
    history = reference.fit(x, y, batch_size=len(batches[0][0]), epochs=1, shuffle=False, verbose=0)
    np.testing.assert_allclose(np.mean(losses), history.history["loss"][0], rtol=RTOL)
    chained = [w.numpy() for s in run.stages for w in s.model.trainable_variables]
    for a, b, b0 in zip(chained, [w.numpy() for w in reference.trainable_variables], start, strict=True):
        assert rel_diff(a, b) <= RTOL
        assert rel_diff(b, b0) > 100 * RTOL  # training moved the weights


def test_a_mean_of_microbatch_means_would_differ(tmp_path):
    """The test above could fail: 3 SGD steps on the mean of the four microbatches' means (each over
    its real tokens) end far from the steps on the mean over the batch's real tokens."""
    import tensorflow as tf

    path = tmp_path / "tokens.npz"
    x, y = token_data(path)
    ends = []
    for per_microbatch in (False, True):
        m, opt = model(), keras.optimizers.SGD(0.5)
        for step in range(STEPS):
            bx, by = x[step * BATCH : (step + 1) * BATCH], y[step * BATCH : (step + 1) * BATCH]
            with tf.GradientTape() as tape:
                logits = m(bx)
                if per_microbatch:
                    loss = tf.add_n([keras_loss()(by[i : i + 2], logits[i : i + 2]) for i in range(0, BATCH, 2)]) / 4
                else:
                    loss = keras_loss()(by, logits)
            opt.apply(tape.gradient(loss, m.trainable_variables), m.trainable_variables)
        ends.append([w.numpy() for w in m.trainable_variables])
    assert max(rel_diff(a, b) for a, b in zip(*ends)) > 100 * RTOL


def test_hugging_faces_ignore_class_minus_100_trains_and_scores_like_keras(tmp_path):
    """Targets padded with -100 (Hugging Face's convention, no class label; the inputs with id 0) and
    `ignore_class=-100`: the data is accepted, 3 SGD steps on microbatches of unequal real tokens equal
    `model.fit` with Keras' own loss of `ignore_class=-100`, and the validation loss and token accuracy
    equal Keras' on the same labels."""
    x, y = token_data(tmp_path / "zero.npz")
    y = np.where(y == PAD, -100, y)
    np.savez(tmp_path / "tokens.npz", x=x, y=y)
    np.savez(tmp_path / "val.npz", x=x[:12], y=y[:12])
    m = model()
    reference = keras.models.clone_model(m)
    reference.set_weights(m.get_weights())
    overrides = ["+stages=2", "pipeline.microbatches=4", "ignore_class=-100", "data.val_fraction=null"]
    run = chain.build(config(tmp_path / "tokens.npz", *overrides, f"data.val_path={tmp_path / 'val.npz'}"), model=m)
    batches = in_order(run, STEPS)
    losses = [float(run.step(bx, by)["loss"]) for bx, by in batches]
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True, ignore_class=-100)
    reference.compile(optimizer=keras.optimizers.SGD(0.5), loss=loss, jit_compile=False)
    seen = [np.concatenate([np.asarray(b[0]) for b in batches]), np.concatenate([b[1]["label"] for b in batches])]
    assert (seen[1] == -100).any()
    history = reference.fit(*seen, batch_size=BATCH, epochs=1, shuffle=False, verbose=0)
    np.testing.assert_allclose(np.mean(losses), history.history["loss"][0], rtol=RTOL)
    for a, b in zip([w.numpy() for s in run.stages for w in s.model.trainable_variables], reference.get_weights()):
        assert rel_diff(a, b) <= RTOL
    got, logits = run.evaluate().chain, reference(x[:12])
    accuracy = keras.metrics.SparseCategoricalAccuracy()
    accuracy.update_state(np.maximum(y[:12], 0), logits, sample_weight=(y[:12] != -100))
    np.testing.assert_allclose(got["loss"], float(loss(y[:12], logits)), rtol=RTOL)
    np.testing.assert_allclose(got["accuracy"], float(accuracy.result()), rtol=RTOL)


def test_validation_scores_real_tokens_like_keras(tmp_path):
    """The validation loss is the mean over every real token of the validation set, and the
    accuracy the share of real tokens predicted right, as Keras computes them on the whole set."""
    path = tmp_path / "tokens.npz"
    x, y = token_data(path)
    np.savez(tmp_path / "val.npz", x=x[:12], y=y[:12])
    run = chain.build(
        config(
            path,
            "+stages=2",
            "pipeline.microbatches=2",
            "data.val_fraction=null",
            f"data.val_path={tmp_path / 'val.npz'}",
            "data.batch_size=4",
        ),
        model=model(),
    )
    got = run.evaluate().chain
    whole = keras.Sequential([s.model for s in run.stages])
    logits = whole(x[:12])
    accuracy = keras.metrics.SparseCategoricalAccuracy()
    accuracy.update_state(y[:12], logits, sample_weight=(y[:12] != PAD))
    np.testing.assert_allclose(got["loss"], float(keras_loss()(y[:12], logits)), rtol=RTOL)
    np.testing.assert_allclose(got["accuracy"], float(accuracy.result()), rtol=RTOL)


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["ignore_class=11"], "ignore_class=11 is not a class label of target 'label'"),
    ],
)
def test_bad_ignore_class_is_one_line(tmp_path, overrides, message):
    path = tmp_path / "tokens.npz"
    token_data(path)
    with pytest.raises(chain.ConfigError, match=message):
        chain.build(config(path, "+stages=2", *overrides), model=model())


def test_perplexity_and_bits_per_token_reach_logs_tensorboard_summary_and_report(tmp_path, caplog):
    """A per-token run's validation shows its token accuracy, perplexity (exp of the mean token loss)
    and bits per token (it over ln 2) in the log line, TensorBoard's chain writer, summary.json and
    the report's curves."""
    import logging
    import math

    from test_validation import events

    path = tmp_path / "tokens.npz"
    token_data(path)
    run_dir = tmp_path / "run"
    run = chain.build(
        config(
            path,
            "+stages=2",
            "pipeline.microbatches=2",
            "data.val_fraction=0.25",
            "trainer.steps=4",
            "trainer.eval_every=2",
            "report=true",
        ),
        model=model(),
        run_dir=str(run_dir),
    )
    with caplog.at_level(logging.INFO, logger="chain"):
        summary = run.fit()
    val = summary["val"]
    assert set(val) == {"loss", "accuracy", "perplexity", "bits_per_token"}
    assert val["perplexity"] == pytest.approx(math.exp(val["loss"]), rel=1e-12)
    assert val["bits_per_token"] == pytest.approx(val["loss"] / math.log(2), rel=1e-12)
    tb = events(run_dir / "tb" / "chain")
    assert sorted(tb["val_perplexity"]) == sorted(tb["val_bits_per_token"]) == [2, 4]
    assert tb["val_perplexity"][4] == pytest.approx(val["perplexity"], rel=1e-6)  # float32
    assert any(f"val_perplexity {val['perplexity']:.4f}" in r.getMessage() for r in caplog.records)
    page = (run_dir / "report.html").read_text()
    assert "val_perplexity (2 points)" in page and "val_bits_per_token (2 points)" in page
