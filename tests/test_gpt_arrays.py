"""`model=gpt` on the user's `(N, T)` arrays of token ids and per-token targets: `data=npz` and
`data=tfrecord`, loaded and streamed.

Oracles: the same ids as windows of a token file (`data=tokens`, sequential, unshuffled), whose targets
are the inputs one token on: the arrays hold exactly those windows, so every form must give the same
batches, losses and weights, bit for bit. With padding (`ignore_class`), Keras' own `train_on_batch` of
the same model with its `ignore_class` loss. Refusals are one line naming the key and the file.
"""

from __future__ import annotations

import keras
import numpy as np
import pytest

import chain
from chain.errors import ConfigError
from compare import assert_trained_like_keras

SEQ, VOCAB, WINDOWS, BATCH, STEPS = 8, 40, 40, 8, 2


def gpt(*extra: str) -> list[str]:
    return [
        "mode=e2e",
        "model=gpt",
        f"model.vocab={VOCAB}",
        "model.width=8",
        "model.heads=2",
        "model.depth=1",
        "+stages=2",
        "pipeline.microbatches=1",
        f"data.batch_size={BATCH}",
        "data.val_fraction=0",
        "data.shuffle=false",
        "optim=sgd",
        "optim.lr=0.5",
        "trainer.progress=false",
        "checkpoint.export=false",
        *extra,
    ]


@pytest.fixture(scope="module")
def ids(tmp_path_factory):
    """A token file and the same ids as (N, T) arrays: its sequential windows and, one token on, their targets
    (`x.npz`, and TFRecord files of int64[T] features split in two)."""
    d = tmp_path_factory.mktemp("ids")
    tokens = np.random.default_rng(5).integers(0, VOCAB, WINDOWS * SEQ + 1).astype(np.uint16)
    tokens.tofile(d / "train.bin")
    w = np.stack([tokens[s : s + SEQ + 1] for s in range(0, WINDOWS * SEQ, SEQ)]).astype(np.int32)
    np.savez(d / "x.npz", x=w[:, :-1], y=w[:, 1:])
    for part, rows in enumerate(np.split(w, 2)):
        write_tfrecord(d / f"part-{part}.tfrecord", rows[:, :-1], rows[:, 1:])
    return d


def write_tfrecord(path, x: np.ndarray, y: np.ndarray) -> None:
    """Rows of ids `x` and their targets `y` as `tf.train.Example`s of int64[T] features x and y."""
    import tensorflow as tf

    with tf.io.TFRecordWriter(str(path)) as out:
        for row_x, row_y in zip(x, y):
            feature = {
                k: tf.train.Feature(int64_list=tf.train.Int64List(value=v.tolist()))
                for k, v in (("x", row_x), ("y", row_y))
            }
            out.write(tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString())


def trained(cfg) -> tuple[list, list[float], list[np.ndarray]]:
    run = chain.build(cfg)
    it = iter(run.batches())
    batches = [next(it) for _ in range(STEPS)]
    losses = [float(run.step(x, y)["loss"]) for x, y in batches]
    return batches, losses, [v.numpy() for s in run.stages for v in s.trainable_variables]


@pytest.fixture(scope="module")
def as_tokens(ids):
    return trained(
        chain.compose(
            gpt(
                "data=tokens",
                f"data.path={ids / 'train.bin'}",
                f"data.seq_len={SEQ}",
                f"data.vocab={VOCAB}",
                "data.windows=sequential",
            )
        )
    )


FORMS = {
    "npz": ["data=npz", "data.path={d}/x.npz", "data.x=x", "data.y=y"],
    "npz-stream": [
        "data=npz",
        "data.path={d}/x.npz",
        "data.x=x",
        "data.y=y",
        "data.stream=true",
        f"data.classes={{label: {VOCAB}}}",
    ],
    "tfrecord": [
        "data=tfrecord",
        "data.path={d}/part-*.tfrecord",
        "data.x=x",
        "data.y=y",
        f"data.features={{x: 'int64[{SEQ}]', y: 'int64[{SEQ}]'}}",
    ],
    "tfrecord-stream": [
        "data=tfrecord",
        "data.path={d}/part-*.tfrecord",
        "data.x=x",
        "data.y=y",
        f"data.features={{x: 'int64[{SEQ}]', y: 'int64[{SEQ}]'}}",
        "data.stream=true",
        f"data.classes={{label: {VOCAB}}}",
    ],
}


@pytest.mark.parametrize("form", list(FORMS))
def test_gpt_trains_on_arrays_of_ids_as_on_the_same_windows_of_a_token_file(ids, as_tokens, form):
    """Loaded or streamed, from `.npz` or TFRecord, the (N, T) ids and targets are the token file's windows
    and the next tokens: the same batches, and 2 steps on 2 stages end on the same losses and weights."""
    cfg = chain.compose(gpt(*[o.replace("{d}", str(ids)) for o in FORMS[form]]))
    assert cfg.stages[0].model.seq_len == SEQ  # the arrays' T
    batches, losses, weights = trained(cfg)
    want_batches, want_losses, want_weights = as_tokens
    for (x, y), (want_x, want_y) in zip(batches, want_batches):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(want_x))
        np.testing.assert_array_equal(np.asarray(y["label"]), np.asarray(want_y["next"]))
    assert losses == want_losses
    for a, b in zip(weights, want_weights, strict=True):
        np.testing.assert_array_equal(a, b)


def test_gpt_with_padded_targets_and_ignore_class_trains_like_keras(tmp_path):
    """Targets padded with a pad id (`ignore_class`), microbatches of unequal real tokens: 2 SGD steps equal
    Keras' `train_on_batch` of the same model with its own `ignore_class` loss."""
    from chain.stages import gpt as gpt_model

    pad, rng = 0, np.random.default_rng(6)
    x = rng.integers(1, VOCAB, (2 * BATCH, SEQ)).astype(np.int32)
    y = rng.integers(1, VOCAB, (2 * BATCH, SEQ)).astype(np.int32)
    for i, n in enumerate([8, 1, 3, 8, 2, 6, 1, 5] * 2):
        x[i, n:] = y[i, n:] = pad
    np.savez(tmp_path / "padded.npz", x=x, y=y)
    cfg = chain.compose(
        gpt(
            "data=npz",
            f"data.path={tmp_path / 'padded.npz'}",
            "data.x=x",
            "data.y=y",
            f"data.classes={{label: {VOCAB}}}",
            f"ignore_class={pad}",
            "pipeline.microbatches=2",
        )
    )
    run = chain.build(cfg)
    keras.utils.set_random_seed(cfg.seed)  # as the chain seeds its models
    reference = gpt_model.build(cfg.stages[0].model)
    reference.compile(
        optimizer=keras.optimizers.SGD(0.5),
        jit_compile=False,
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True, ignore_class=pad),
    )
    start = {v.path: v.numpy() for v in reference.trainable_variables}
    assert_trained_like_keras(run, reference, [(x[:BATCH], y[:BATCH]), (x[BATCH:], y[BATCH:])], start)


def test_gpt_refuses_float_ids_and_targets_not_per_position_in_one_line(ids, tmp_path):
    import tensorflow as tf

    np.savez(tmp_path / "floats.npz", x=np.zeros((WINDOWS, SEQ), np.float32), y=np.zeros((WINDOWS, SEQ), np.int32))
    np.savez(tmp_path / "one.npz", x=np.zeros((WINDOWS, SEQ), np.int32), y=np.arange(WINDOWS) % VOCAB)
    with tf.io.TFRecordWriter(str(tmp_path / "floats.tfrecord")) as out:
        out.write(
            tf.train.Example(
                features=tf.train.Features(
                    feature={
                        "x": tf.train.Feature(float_list=tf.train.FloatList(value=[0.0] * SEQ)),
                        "y": tf.train.Feature(int64_list=tf.train.Int64List(value=[0] * SEQ)),
                    }
                )
            ).SerializeToString()
        )
    cases = [
        (
            ["data=npz", f"data.path={tmp_path / 'floats.npz'}"],
            f"model=gpt reads token ids, one row of integer ids per example "
            f"((N, T)), but data.x='x' of {tmp_path / 'floats.npz'} holds float32 of shape ({WINDOWS}, {SEQ}); give "
            "integer ids (e.g. np.int32)",
        ),
        (
            [
                "data=tfrecord",
                f"data.path={tmp_path}/floats.tfrecord",
                f"data.features={{x: 'float32[{SEQ}]', y: 'int64[{SEQ}]'}}",
            ],
            f"model=gpt reads token ids, one row of integer ids per example ((N, T)), but data.x='x' (data.features) "
            f"holds float32[{SEQ}] per example",
        ),
        (
            ["data=npz", f"data.path={tmp_path / 'one.npz'}"],
            f"model=gpt learns a label per position of its {SEQ} "
            "ids, but target 'label' of data=npz holds one label per example: give an (N, 8) array of integer ids",
        ),
        (
            ["data=npz", f"data.path={ids / 'x.npz'}", "model.seq_len=4"],
            f"model.seq_len=4 differs from data.x='x''s {SEQ} ids per example",
        ),
    ]
    for overrides, message in cases:
        with pytest.raises(ConfigError) as e:
            chain.compose(gpt(*overrides, "data.x=x", "data.y=y"))
        assert message in str(e.value) and "\n" not in str(e.value), str(e.value)


def test_gpt_stops_on_an_id_outside_the_vocabulary_of_a_streamed_tfrecord_in_one_line_naming_the_record(tmp_path):
    """A streamed TFRecord is read only while training: each chunk's ids are checked as it is read, and one
    outside the vocabulary stops the run in one line naming the feature, the record and its file (not an
    error of TensorFlow's lookup); a target's `ignore_class` label (-100) is not one."""
    rng = np.random.default_rng(8)
    x, y = rng.integers(0, VOCAB, (2, WINDOWS // 2, SEQ)), rng.integers(0, VOCAB, (2, WINDOWS // 2, SEQ))
    x[0, 13, 2], y[0, 4, 5] = VOCAB + 5, -100  # read by step 2: the same chunk
    for part in range(2):
        write_tfrecord(tmp_path / f"part-{part}.tfrecord", x[part], y[part])
    form = [o.replace("{d}", str(tmp_path)) for o in FORMS["tfrecord-stream"]]
    run = chain.build(chain.compose(gpt(*form, "ignore_class=-100", "trainer.steps=3")))
    with pytest.raises(ConfigError) as e:
        run.fit()
    assert str(e.value) == (
        f"feature x of record 13 of {tmp_path / 'part-0.tfrecord'} holds the id {VOCAB + 5}; model.vocab={VOCAB} "
        f"takes ids 0..{VOCAB - 1}: give model.vocab (and data.classes) the largest id + 1 or more; no checkpoint "
        "had been saved"
    )


@pytest.mark.parametrize("stream", [False, True])
def test_gpt_refuses_ids_outside_the_vocabulary_in_one_line_naming_the_file(tmp_path, stream):
    """An input id >= model.vocab (the targets' classes: data.classes) is one line naming data.x and the file,
    before training: loaded, from the arrays; streamed, read in place once."""
    x = np.random.default_rng(7).integers(0, VOCAB, (WINDOWS, SEQ)).astype(np.int64)
    x[5, 3] = VOCAB + 2
    path = tmp_path / "wide.npz"
    np.savez(path, x=x, y=np.roll(x, -1, axis=1) % VOCAB)
    with pytest.raises(ConfigError) as e:
        chain.build(
            chain.compose(
                gpt(
                    "data=npz",
                    f"data.path={path}",
                    "data.x=x",
                    "data.y=y",
                    f"data.classes={{label: {VOCAB}}}",
                    f"data.stream={str(stream).lower()}",
                )
            )
        )
    assert str(e.value) == (
        f"data.x='x' of {path} holds the id {VOCAB + 2}; model.vocab={VOCAB} takes ids "
        f"0..{VOCAB - 1}: give model.vocab (and data.classes) the largest id + 1 or more"
    )
