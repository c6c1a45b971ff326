"""Examples of different lengths: `data=text data.examples=lines` in length buckets (`data.buckets`). Oracles:
the same `model=gpt` on one device (Keras' own `train_on_batch`, its loss ignoring the padding id 0) on the
same batches; the step's traces counted per bucket; a resumed run's checkpoints bit for bit; config errors
one line naming the key."""

from __future__ import annotations

import random
import re

import keras
import numpy as np
import pytest

import chain
from chain.errors import ConfigError
from compare import assert_trained_like_keras, assert_variables_like, by_path
from conftest import EXTENDED, read_summary, stage_values, straight_and_resumed

BUCKETS = (8, 16, 32)


@pytest.fixture(scope="module")
def lines(tmp_path_factory):
    """Lines of 2 to 40 characters (the longest cut to 32), none empty."""
    rng = random.Random(0)
    text = "\n".join(
        "".join(rng.choice("abcdefgh ") for _ in range(rng.choice([2, 5, 9, 14, 20, 30, 40]))) for _ in range(240)
    )
    path = tmp_path_factory.mktemp("lines") / "a.txt"
    path.write_text(text + "\n")
    return str(path)


def varlen_run(path: str, *extra: str) -> list[str]:
    return [
        "mode=e2e",
        "model=gpt",
        "data=text",
        f"data.path={path}",
        "data.examples=lines",
        "data.buckets=[" + ",".join(map(str, BUCKETS)) + "]",
        "data.seq_len=32",
        "data.batch_size=8",
        "model.width=16",
        "model.heads=2",
        "model.depth=2",
        "trainer.progress=false",
        "checkpoint.export=false",
        "optim=sgd",
        "optim.lr=0.5",
        *extra,
    ]


@EXTENDED  # the suite's time: the tfrecord ids' buckets train like one device every time, these lines resume below
def test_bucketed_lines_on_two_stages_train_like_one_device_and_trace_once_per_bucket(lines):
    """GPipe over 2 stages, 2 microbatches, on the stream's own bucketed batches: every loss and weight equals
    Keras' own steps of the same model on one device (padding ignored: `ignore_class` settled to 0); the
    step is traced once for each bucket and never again."""
    from chain.stages import gpt

    cfg = chain.compose(varlen_run(lines, "+stages=2", "pipeline.schedule=gpipe", "pipeline.microbatches=2"))
    assert cfg.ignore_class == 0
    run = chain.build(cfg)
    keras.utils.set_random_seed(cfg.seed)  # as the chain seeds its models
    reference = gpt.build(cfg.stages[0].model, any_length=True)
    reference.compile(
        optimizer=keras.optimizers.SGD(0.5),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True, ignore_class=0),
        jit_compile=False,
    )
    it = iter(run.batches())
    data = [(x.numpy(), ys["next"].numpy()) for x, ys in (next(it) for _ in range(8))]
    lengths = {x.shape[1] for x, _ in data}
    assert lengths == set(BUCKETS)  # every bucket met, twice or more among 8 batches
    assert all(((x == 0) == (y == 0)).all() for x, y in data)  # the padding: the same positions in x and y
    start = {v.path: v.numpy() for v in reference.trainable_variables}
    assert_trained_like_keras(run, reference, data, start)
    assert run.strategy.traces == {str(n): 1 for n in BUCKETS}


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["data.buckets=[16,8]"], "data.buckets=[16,8] must be increasing"),
        (["data.buckets=[8,64]"], "data.buckets=[8,64] holds 64, longer than data.seq_len=32"),
        (["data.examples=windows"], "data.buckets=[8,16,32] needs examples of different lengths"),
        (["data.buckets=null"], "data.examples=lines makes examples of different lengths: give data.buckets"),
        (["data.pack=true"], "data.pack=true packs examples of different lengths into windows: it needs"),
        (["ignore_class=3"], "ignore_class=3, but examples of different lengths pad their targets with id 0"),
    ],
)
def test_bad_buckets_are_one_line_naming_the_key(lines, overrides, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        chain.compose(varlen_run(lines, *overrides))


def test_auto_buckets_come_from_the_lengths_and_the_cut_is_counted(lines, caplog):
    with caplog.at_level("INFO"):
        cfg = chain.compose(varlen_run(lines, "data.buckets=auto"))
    shown = [r.getMessage() for r in caplog.records]
    assert any(m.startswith("data.buckets=auto: [") for m in shown), shown
    assert any(" examples cut to 32 ids (the largest bucket)" in m for m in shown), shown
    assert cfg.data.buckets == "auto"


def test_a_bucketed_stream_resumes_bit_for_bit_and_summary_shows_its_traces(lines, tmp_path):
    args = varlen_run(lines, "+stages=2", "trainer.steps=6", "checkpoint.every=3", "trainer.steps_per_call=1")
    straight, resumed = straight_and_resumed(tmp_path, args, every=3, kill_at=5)
    for stage in ("stage_00", "stage_01"):
        a, b = stage_values(straight, stage), stage_values(resumed, stage)
        assert a.keys() == b.keys()
        for k in a:
            np.testing.assert_array_equal(a[k], b[k], err_msg=k)
    traces = read_summary(straight)["traces"]
    assert set(traces) <= {str(n) for n in BUCKETS} and set(traces.values()) == {1}


def test_files_are_one_example_each_and_a_nul_byte_is_refused_naming_the_file(tmp_path):
    from chain.data.sources import describe

    for k, n in enumerate([5, 12, 20, 31, 40]):
        (tmp_path / f"{k}.txt").write_text("ab" * n)
    cfg = chain.compose(
        varlen_run(str(tmp_path / "*.txt"), "data.examples=files", "data.val_fraction=0", "data.batch_size=4")
    )
    info = describe(cfg.data)
    assert (info.examples, info.input_shape, info.lengths_vary) == (5, (32,), True)  # 2n bytes, 2n - 1 inputs
    (tmp_path / "5.txt").write_bytes(b"ab\x00c")
    with pytest.raises(ConfigError, match=r"5.txt holds a NUL byte \(byte 2\), the padding id of data.examples=files"):
        chain.compose(varlen_run(str(tmp_path / "*.txt"), "data.examples=files"))


@pytest.fixture(scope="module")
def id_records(tmp_path_factory):
    """Two TFRecord files of examples of 1 to 16 ids (1..19; 0 pads) and a label per example, and a masked
    encoder (Embedding(mask_zero=True), a Dense, masked average pooling, a Dense read-out) saved as .keras."""
    import tensorflow as tf

    root = tmp_path_factory.mktemp("id_records")
    rng = np.random.default_rng(0)
    for f in range(2):
        with tf.io.TFRecordWriter(str(root / f"{f}.tfrecord")) as w:
            for _ in range(48):
                ids = rng.integers(1, 20, rng.integers(1, 17)).tolist()
                feature = {
                    "x": tf.train.Feature(int64_list=tf.train.Int64List(value=ids)),
                    "label": tf.train.Feature(int64_list=tf.train.Int64List(value=[sum(ids) % 2])),
                }
                w.write(tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString())
    keras.utils.set_random_seed(0)
    ids = keras.Input((None,), dtype="int64")
    h = keras.layers.Embedding(20, 8, mask_zero=True)(ids)
    h = keras.layers.Dense(8, activation="tanh")(h)
    h = keras.layers.GlobalAveragePooling1D()(h)
    keras.Model(ids, keras.layers.Dense(2)(h)).save(root / "encoder.keras")
    return root


def id_stream(root) -> list[str]:
    """The `id_records` streamed: `int64[None]` ids and a label per example, in buckets [4,8,16]."""
    return [
        "data=tfrecord",
        f"data.path={root / '*.tfrecord'}",
        "data.stream=true",
        "data.features={x: 'int64[None]', label: int64}",
        "data.x=x",
        "data.y=label",
        "data.classes={label: 2}",
        "data.buckets=[4,8,16]",
    ]


def encoder_run(root) -> list[str]:
    """The masked encoder of `id_records` (`root`) in 2 stages, SGD, batches of 8, no validation."""
    return [
        "mode=e2e",
        "+stages=2",
        "model=keras",
        f"model.path={root / 'encoder.keras'}",
        "data.val_fraction=0",
        "data.batch_size=8",
        "optim=sgd",
        "trainer.progress=false",
        "checkpoint.export=false",
    ]


def test_a_masked_encoder_on_variable_length_tfrecord_ids_trains_like_one_device_once_per_bucket(id_records):
    """`int64[None]` ids and a label per example in buckets [4,8,16], the user's masked encoder cut into 2
    stages (GPipe, one microbatch: at 2 the losses are equal too, but float sums move a small bias by 1.2e-5
    relative, 1e-7 absolute): the stream's own batches train it as Keras' `train_on_batch` does the same
    model on one device (1e-5), the step traced once per bucket."""
    cfg = chain.compose([*id_stream(id_records), *encoder_run(id_records), "pipeline.schedule=gpipe", "optim.lr=0.5"])
    assert cfg.ignore_class is None  # a label per example: no padding in the targets
    run = chain.build(cfg)
    reference = keras.models.load_model(id_records / "encoder.keras")
    reference.compile(
        optimizer=keras.optimizers.SGD(0.5),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        jit_compile=False,
    )
    it = iter(run.batches())
    data = [(x.numpy(), ys["label"].numpy()) for x, ys in (next(it) for _ in range(8))]
    assert {x.shape[1] for x, _ in data} == {4, 8, 16}
    start = {v.path: v.numpy() for v in reference.trainable_variables}
    assert_trained_like_keras(run, reference, data, start)
    assert run.strategy.traces == {"4": 1, "8": 1, "16": 1}
    _resumes_exactly(run.batches(), str(id_records / "stream"))


def _resumes_exactly(stream, prefix: str) -> None:
    """The stream's iterator saved after 3 batches and restored gives the same next 5 batches (what a
    checkpoint keeps of it: the files' positions, the shuffle buffer, each bucket's partial group)."""
    import tensorflow as tf

    it = iter(stream)
    for _ in range(3):
        next(it)
    saved = tf.train.Checkpoint(stream=it).write(prefix)
    want = [next(it) for _ in range(5)]
    tf.train.Checkpoint(stream=it).read(saved).assert_consumed()
    for batch in want:
        for got, t in zip(tf.nest.flatten(next(it)), tf.nest.flatten(batch)):
            np.testing.assert_array_equal(got.numpy(), t.numpy())


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["data.stream=false"], "data.features declares x int64[None] (ids of any length): it needs data.stream=true"),
        (["data.buckets=[8,4]"], "data.buckets=[8,4] must be increasing"),
        (["data.features={x: 'int64[16]', label: int64}"], "data.buckets needs an input of any length"),
    ],
)
def test_bad_variable_length_tfrecord_settings_are_one_line(id_records, overrides, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        chain.compose([*id_stream(id_records), *overrides])


def test_packed_windows_train_like_their_examples_unpacked_on_one_device(lines, tmp_path):
    """`data.pack=true`: windows of 32 holding several lines, 2 stages (GPipe, 2 microbatches): each step's
    loss and the weights after 3 SGD steps equal one device's steps on the same examples unpacked (each run
    alone, the loss the mean over every real token of the batch), within 1e-5: a token sees only its own
    segment and its position restarts with it."""
    from chain.stages import gpt

    cfg = chain.compose(
        varlen_run(lines, "data.pack=true", "data.buckets=null", "+stages=2", "pipeline.microbatches=2", "optim.lr=0.1")
    )
    run = chain.build(cfg)
    keras.utils.set_random_seed(cfg.seed)  # as the chain seeds its models
    reference = gpt.build(cfg.stages[0].model, any_length=True)
    assert_packed_like_unpacked(run, reference, lambda rows: rows, 0.1)
    _resumes_exactly(run.batches(), str(tmp_path / "stream"))


def assert_packed_like_unpacked(run, reference, fed, lr: float, steps: int = 3) -> None:
    """`steps` of `run` on its packed batches against SGD steps of `reference` on one device on the same
    examples unpacked, one a row (`fed(ids)`: its input for the rows of ids, each padded at its end, which
    causal attention keeps from the real tokens), each loss the mean over every real token of the batch:
    losses within 1e-5, then every weight."""
    import tensorflow as tf

    variables = reference.trainable_variables
    start = {v.path: v.numpy() for v in variables}
    it = iter(run.batches())
    for _ in range(steps):
        x, ys = next(it)
        ids, seg, y = x["token_ids"].numpy(), x["segment_ids"].numpy(), ys["next"].numpy()
        assert max(len(set(r.tolist()) - {0}) for r in seg) > 1  # several examples in a window
        examples = [(ids[r, seg[r] == s], y[r, seg[r] == s]) for r in range(len(ids)) for s in set(seg[r]) - {0}]
        rows = np.zeros((2, len(examples), max(len(e) for e, _ in examples)), np.int32)
        for k, (e, t) in enumerate(examples):
            rows[:, k, : len(e)] = e, t
        real = np.zeros(rows.shape[1:], np.float32)
        for k, (e, _) in enumerate(examples):
            real[k, : len(e)] = 1
        with tf.GradientTape() as tape:
            logits = reference(fed(rows[0]), training=True)
            per_token = keras.losses.sparse_categorical_crossentropy(rows[1], logits, from_logits=True)
            want = tf.reduce_sum(per_token * real) / real.sum()
        grads = tape.gradient(want, variables)
        np.testing.assert_allclose(run.step(x, ys)["loss"], float(want), rtol=1e-5)
        for v, g in zip(variables, grads):
            v.assign_sub(lr * tf.convert_to_tensor(g))
    assert_variables_like(
        [v for s in run.stages for v in s.trainable_variables],
        by_path(variables),
        start,
        tied={c.name for s in run.stages for c in s.shared},
    )


@pytest.fixture(scope="module")
def segment_models(tmp_path_factory):
    """A user's Keras transformer taking packed windows by name, `{"token_ids", "segment_ids"}`: positions
    restarting per segment (`SegmentPositions`), 2 blocks of causal attention masked to the segment
    (`SegmentMask`); and a model of one input, which packed windows cannot feed. Saved as .keras."""
    from chain.stages.savable import SegmentMask, SegmentPositions

    root = tmp_path_factory.mktemp("segments")
    keras.utils.set_random_seed(0)
    ids = keras.Input((None,), dtype="int32", name="token_ids")
    seg = keras.Input((None,), dtype="int32", name="segment_ids")
    h = keras.layers.Embedding(256, 16)(ids) + keras.layers.Embedding(32, 16)(SegmentPositions()(seg))
    for _ in range(2):
        a = keras.layers.MultiHeadAttention(2, 8)(h, h, attention_mask=SegmentMask()(seg), use_causal_mask=True)
        h = keras.layers.LayerNormalization()(h + a)
    keras.Model({"token_ids": ids, "segment_ids": seg}, keras.layers.Dense(256)(h)).save(root / "packed.keras")
    one = keras.Input((None,), dtype="int32")
    keras.Model(one, keras.layers.Dense(256)(keras.layers.Embedding(256, 8)(one))).save(root / "plain.keras")
    return root


def packed_keras(lines, path) -> list[str]:
    """`lines` packed into windows of 32 for the `model=keras` file `path`, in 2 stages."""
    gpt_free = [a for a in varlen_run(lines, "data.pack=true", "data.buckets=null", "+stages=2") if "model" not in a]
    return [*gpt_free, "optim.lr=0.1", "model=keras", "data.batch_size=4", f"model.path={path}"]


@EXTENDED  # for the suite's time: the same packing as model=gpt's test above, through the user's named inputs
def test_a_keras_model_given_the_segment_ids_trains_packed_like_its_examples_unpacked(lines, segment_models):
    """`model=keras` declaring inputs `token_ids` and `segment_ids`, cut in 2 stages (the segment ids cross
    the cut to the second block), on packed windows: each step's per-token loss and the weights after 3 SGD
    steps equal the loaded model's steps on one device on the same examples unpacked (1e-5)."""
    run = chain.build(chain.compose(packed_keras(lines, segment_models / "packed.keras")))
    reference = keras.models.load_model(segment_models / "packed.keras")
    assert_packed_like_unpacked(
        run, reference, lambda rows: {"token_ids": rows, "segment_ids": np.ones_like(rows)}, 0.1
    )


def test_packed_windows_for_a_model_without_segment_ids_are_one_line(lines, segment_models):
    with pytest.raises(ConfigError, match=r"data.pack=true gives the model .*plain.keras takes one tensor: declare"):
        chain.build(chain.compose(packed_keras(lines, segment_models / "plain.keras")))


@pytest.fixture(scope="module")
def ragged_pair(tmp_path_factory):
    """The same 96 examples of 1 to 16 ids (1..19) and a label per example twice: one TFRecord file of
    `int64[None]` records, and an `.npz` of the flat ids, their (N+1,) offsets and the labels."""
    import tensorflow as tf

    root = tmp_path_factory.mktemp("ragged")
    rng = np.random.default_rng(1)
    examples = [rng.integers(1, 20, rng.integers(1, 17)) for _ in range(96)]
    labels = np.array([int(e.sum()) % 2 for e in examples])
    with tf.io.TFRecordWriter(str(root / "one.tfrecord")) as w:
        for ids, label in zip(examples, labels):
            feature = {
                "x": tf.train.Feature(int64_list=tf.train.Int64List(value=ids.tolist())),
                "label": tf.train.Feature(int64_list=tf.train.Int64List(value=[label])),
            }
            w.write(tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString())
    offsets = np.concatenate([[0], np.cumsum([len(e) for e in examples])])
    np.savez(root / "ragged.npz", ids=np.concatenate(examples), offsets=offsets, label=labels)
    return root


def ragged_npz(path, *extra: str) -> list[str]:
    """`path`'s ragged ids streamed in buckets [4,8,16], a label per example."""
    return [
        "data=npz",
        f"data.path={path}",
        "data.x=ids",
        "data.offsets=offsets",
        "data.y=label",
        "data.stream=true",
        "data.classes={label: 2}",
        "data.buckets=[4,8,16]",
        *extra,
    ]


def test_ragged_npz_streams_bit_for_bit_as_the_same_examples_in_a_tfrecord(ragged_pair, id_records):
    """`data=npz data.offsets=...` and the same examples as `int64[None]` TFRecords, both shuffled in buckets
    [4,8,16]: the same batches, bit for bit (so the same training); the masked encoder in 2 stages trains on
    the npz's, each bucket traced once."""
    from chain.data import sources

    records = [*id_stream(ragged_pair)[:-1], f"data.path={ragged_pair / 'one.tfrecord'}", "data.buckets=[4,8,16]"]
    npz = ragged_npz(ragged_pair / "ragged.npz", *encoder_run(id_records))
    cfgs = [chain.compose([*records, "data.val_fraction=0"]), chain.compose(npz)]
    streams = [iter(sources.SOURCES[c.data.name].shards(c.data).training(8, True, c.seed)) for c in cfgs]
    for _ in range(8):
        for a, b in zip(*(tf_leaves(next(s)) for s in streams)):
            np.testing.assert_array_equal(a, b)
    run = chain.build(cfgs[1])
    it = iter(run.batches())
    losses = [run.step(*next(it))["loss"] for _ in range(3)]
    assert np.isfinite(losses).all()
    assert set(run.strategy.traces.values()) == {1} and len(run.strategy.traces) > 1


def tf_leaves(batch) -> list[np.ndarray]:
    import tensorflow as tf

    return [t.numpy() for t in tf.nest.flatten(batch)]


@pytest.mark.parametrize(
    "arrays, message",
    [
        ({"offsets": [0, 3, 2, 6]}, "data.offsets='offsets' of {} is not increasing from 0 (offsets[2] is 2)"),
        ({"offsets": [0, 2, 4, 5]}, "data.offsets='offsets' of {} ends at 5, but data.x='ids' holds 6 ids"),
        ({"label": [0, 1]}, "data.y='label' of {} has shape (2,); with data.offsets a target holds one value per"),
    ],
)
def test_a_damaged_ragged_npz_is_one_line_naming_the_file_and_the_array(tmp_path, arrays, message):
    path = tmp_path / "bad.npz"
    np.savez(
        path,
        **{
            "ids": np.arange(1, 7),
            "offsets": np.array([0, 2, 4, 6]),
            "label": np.array([0, 1, 0]),
            **{k: np.array(v) for k, v in arrays.items()},
        },
    )
    with pytest.raises(ConfigError, match=re.escape(message.format(path))):
        chain.compose(ragged_npz(path, "data.val_fraction=0"))


@pytest.mark.parametrize("given", ["tfrecord", "pack"])
def test_streams_of_different_lengths_in_mirrored_shares_are_refused_before_training(id_records, lines, given):
    """Mirrored replicas stream their own files: batches of different buckets (or packed windows) in one step
    are refused in the preparation pass (before TensorFlow's runtime), not when the stream opens."""
    args = id_stream(id_records) if given == "tfrecord" else varlen_run(lines, "data.pack=true", "data.buckets=null")
    want = "data.buckets with" if given == "tfrecord" else "data.pack=true with"
    with pytest.raises(ConfigError, match=f"{want} placement.fallback=mirrored: each mirrored replica streams"):
        chain.prepare([*args, "+stages=2", "placement.fallback=mirrored", "data.batch_size=8"])


def test_a_tokenizer_makes_each_line_an_example_of_its_own_ids(tmp_path):
    """`data.tokenizer` with `data.examples=lines`: each line tokenized alone is one example (its ids the
    inputs but the last, the targets one on), the stream's identity the texts and the vocabulary."""
    from chain.data import sources
    from chain.data.sources.text import text_examples, text_tokens
    from chain.data.streamed import VOCABULARY

    words = ["[PAD]", "[UNK]", "the", "quick", "brown", "fox", "jumps", "over", "lazy", "dog", "."]
    (tmp_path / "vocab.txt").write_text("\n".join(words) + "\n")
    rng = random.Random(0)
    lines = [" ".join(rng.choice(words[2:]) for _ in range(rng.randint(1, 12))) for _ in range(40)]
    (tmp_path / "a.txt").write_text("\n".join(lines) + "\n")
    cfg = chain.compose(
        varlen_run(
            tmp_path / "a.txt", f"data.tokenizer={tmp_path / 'vocab.txt'}", "data.val_fraction=0", "model.vocab=11"
        )
    )
    s = sources.SOURCES["text"].shards(cfg.data)
    tok = text_tokens.tokenizer(text_tokens.vocabulary(str(tmp_path / "vocab.txt")))
    want = [ids for ids in (list(tok(line)) for line in lines) if len(ids) >= 2]
    assert (s.examples, s.vocab) == (len(want), len(words))
    x, y = text_examples.padded(s.train, np.arange(len(want)), 32)
    for k, ids in enumerate(want):
        assert x[k, : len(ids) - 1].tolist() == ids[:-1] and y[k, : len(ids) - 1].tolist() == ids[1:]
        assert not x[k, len(ids) - 1 :].any()
    assert [role for *_, role in s.files_read()] == ["train", VOCABULARY]
