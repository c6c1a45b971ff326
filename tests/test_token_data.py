"""`data=tokens`: a flat file of token ids (nanoGPT's train.bin) streamed in windows of seq_len + 1.

The oracle is the file itself, read with NumPy: every example is a window of it and its targets the
same window one token on; a shuffled epoch holds every window once; ids above 2^24 arrive exact.
Resume: a run killed after a checkpoint and resumed ends bit for bit where an uninterrupted run ends.
"""

from __future__ import annotations

import os
import re
import shutil

import keras
import numpy as np
import pytest

import chain
from chain.data.data_source import MAX_CLASSES
from conftest import EXTENDED, stage_values, straight_and_resumed

SEQ, VOCAB, TOKENS = 8, 40, 1001  # 125 windows at a stride of 8 (each needs 9 tokens)


def token_file(path, dtype=np.uint16, top: int = VOCAB) -> np.ndarray:
    ids = np.random.default_rng(4).integers(0, top, TOKENS).astype(dtype)
    ids.tofile(path)
    return ids


def config(path, *overrides: str):
    return chain.compose(
        [
            "mode=e2e",
            "+stages=2",
            "data=tokens",
            f"data.path={path}",
            f"data.seq_len={SEQ}",
            "data.batch_size=5",
            "optim=sgd",
            "trainer.progress=false",
            "checkpoint.export=false",
            *overrides,
        ]
    )


def lm(vocab: int = VOCAB, dtype: str = "int32") -> keras.Model:
    keras.utils.set_random_seed(2)
    return keras.Sequential(
        [
            keras.Input((SEQ,), dtype=dtype),
            keras.layers.Embedding(vocab, 4),
            keras.layers.Dense(6, activation="tanh"),
            keras.layers.Dense(vocab),
        ],
        name="lm",
    )


def take(run, n: int) -> tuple[np.ndarray, np.ndarray]:
    it = iter(run.batches())
    batches = [next(it) for _ in range(n)]
    return (
        np.concatenate([np.asarray(b[0]) for b in batches]).astype(np.int64),
        np.concatenate([np.asarray(b[1]["next"]) for b in batches]),
    )


def windows_of(ids: np.ndarray, starts) -> tuple[np.ndarray, np.ndarray]:
    w = np.stack([ids[s : s + SEQ + 1] for s in starts]).astype(np.int64)
    return w[:, :-1], w[:, 1:]


def test_sequential_windows_are_the_file_in_order_and_its_targets_one_token_on(tmp_path):
    ids = token_file(tmp_path / "train.bin")
    run = chain.build(config(tmp_path / "train.bin", "data.shuffle=false", "data.val_fraction=0"), model=lm())
    assert run.dataset.info.examples == (TOKENS - 1) // SEQ and run.dataset.targets[0].classes == VOCAB
    assert np.asarray(next(iter(run.batches()))[0]).dtype == np.int32
    x, y = take(run, 4)
    want_x, want_y = windows_of(ids, range(0, 20 * SEQ, SEQ))
    assert y.dtype == np.int32
    np.testing.assert_array_equal(x, want_x)
    np.testing.assert_array_equal(y, want_y)


def test_a_shuffled_epoch_holds_every_window_once_and_the_next_epoch_another_order(tmp_path):
    ids = token_file(tmp_path / "train.bin")
    run = chain.build(config(tmp_path / "train.bin", "data.val_fraction=0"), model=lm())
    x, y = take(run, 50)  # two epochs of 125 windows
    every, _ = windows_of(ids, range(0, 125 * SEQ, SEQ))
    for epoch in (x[:125], x[125:]):
        assert sorted(map(bytes, epoch)) == sorted(map(bytes, every))
    assert not np.array_equal(x[:125], every) and not np.array_equal(x[:125], x[125:])
    index = {bytes(w): k for k, w in enumerate(every)}
    np.testing.assert_array_equal(y[:125], windows_of(ids, [index[bytes(w)] * SEQ for w in x[:125]])[1])


def test_random_windows_start_anywhere_and_validation_is_the_last_tokens(tmp_path):
    ids = token_file(tmp_path / "train.bin")
    run = chain.build(config(tmp_path / "train.bin", "data.windows=random"), model=lm())
    held = round(TOKENS * 0.1)
    x, y = take(run, 20)
    text = ids.astype(np.int64).tobytes()
    starts = [text.find(w.tobytes()) // 8 for w in x]
    assert all(0 <= s <= TOKENS - held - SEQ - 1 for s in starts)  # windows of the training tokens
    assert len({s % SEQ for s in starts}) > 1  # not only at the sequential stride
    np.testing.assert_array_equal(y, windows_of(ids, starts)[1])
    val_x = np.concatenate([np.asarray(b[0]) for b, _ in zip(run.validation_batches(), range(100))])
    np.testing.assert_array_equal(val_x, windows_of(ids, range(TOKENS - held, TOKENS - SEQ - 1 + 1, SEQ))[0])


def test_uint32_ids_up_to_the_vocab_limit_stay_exact(tmp_path):
    ids = token_file(tmp_path / "train.bin", np.uint32)
    ids += np.uint32(MAX_CLASSES - VOCAB)  # ids up to data.vocab's limit 2^20 - 1, odd ones included
    ids.tofile(tmp_path / "train.bin")
    cfg = config(tmp_path / "train.bin", "data.dtype=uint32", "data.shuffle=false", "data.val_fraction=0")
    from chain.data import loader, stream

    ds = loader.load(cfg.data, 0)  # no model: an Embedding of 2^20 rows is too large for a test
    assert ds.targets[0].classes == MAX_CLASSES
    x, ys = next(iter(stream.training_batches(ds, 5, shuffle=False, seed=0)))
    assert x.dtype.name == "int64"
    np.testing.assert_array_equal(x.numpy(), windows_of(ids, range(0, 5 * SEQ, SEQ))[0])
    np.testing.assert_array_equal(ys["next"].numpy(), windows_of(ids, range(0, 5 * SEQ, SEQ))[1])


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["data.dtype=uint32"], "holds 2002 bytes, not a whole number of data.dtype=uint32 ids"),
        ([f"data.vocab={VOCAB - 5}"], f"data.vocab={VOCAB - 5}, but the token files hold the id {VOCAB - 1}"),
        (["data.seq_len=1000"], "fewer than one window of data.seq_len=1000 + 1"),
        (["data.path=/nonexistent.bin"], "data.path='/nonexistent.bin': the file does not exist"),
    ],
)
def test_bad_token_settings_are_one_line(tmp_path, overrides, message):
    token_file(tmp_path / "train.bin")
    with pytest.raises(chain.ConfigError, match=message.replace("+", r"\+").replace("(", r"\(")):
        chain.build(config(tmp_path / "train.bin", *overrides), model=lm())


WORDPIECE = [
    "[PAD]",
    "[UNK]",
    "the",
    "quick",
    "brown",
    "fox",
    "jumps",
    "over",
    "lazy",
    "dog",
    "vu",
    ":",
    "→",
    "ok",
    ".",
]  # text_files' words (the accented ones unknown)


def _prepare(path, *overrides: str):
    return chain.prepare(
        ["mode=e2e", "+stages=2", "data=tokens", f"data.path={path}", f"data.seq_len={SEQ}", *overrides]
    )


@pytest.mark.parametrize("top, said", [(VOCAB, "0"), (100_000, "below 16")])
def test_uint32_ids_read_as_uint16_are_refused_naming_data_dtype(tmp_path, top, said):
    """The default data.dtype=uint16 over a uint32 file reads the high half of each id as an id of its
    own: 0 (below 16 for ids past 65535) at every odd position. One line naming data.dtype, not a run
    that learns to predict the zeros; a real uint16 file of many zeros is not taken for one."""
    token_file(tmp_path / "u32.bin", np.uint32, top)
    with pytest.raises(chain.ConfigError) as e:
        _prepare(tmp_path / "u32.bin", "data.vocab=256")
    found = re.fullmatch(
        re.escape(
            f"data.path={str(tmp_path / 'u32.bin')!r} looks like uint32 ids read as "
            f"data.dtype=uint16: at {TOKENS} pairs of positions sampled over it, every second "
            f"id is {said} (the high half of a uint32 id) and "
        )
        + r"(\d+)"
        + re.escape(" of the others are not; set data.dtype=uint32"),
        str(e.value),
    )
    assert found and TOKENS // 4 <= int(found[1]) <= TOKENS, str(e.value)
    _prepare(tmp_path / "u32.bin", "data.dtype=uint32")  # read at its width, it is taken
    # zeros anywhere in a real uint16 file, even at every odd position of half of it, leave it alone
    ids = np.random.default_rng(4).integers(0, VOCAB, 8000).astype(np.uint16)
    ids[np.random.default_rng(5).random(8000) < 0.7] = 0
    ids[1:4000:2] = 0
    ids.tofile(tmp_path / "u16.bin")
    _prepare(tmp_path / "u16.bin")


def test_uint16_ids_read_as_uint32_are_refused_naming_the_width_not_a_vocab_over_the_limit(tmp_path):
    """A uint16 file read as uint32 makes ids of two ids each, over data.vocab's limit: one line naming
    data.dtype=uint16 whether data.vocab is given or derived, never advising a vocabulary over the limit."""
    ids = np.random.default_rng(4).integers(0, VOCAB, TOKENS - 1).astype(np.uint16)  # a whole number of uint32
    ids.tofile(tmp_path / "u16.bin")
    top = int(ids.view(np.uint32).max())
    for vocab in ([], [f"data.vocab={VOCAB}"]):
        with pytest.raises(chain.ConfigError) as e:
            _prepare(tmp_path / "u16.bin", "data.dtype=uint32", *vocab)
        assert str(e.value) == (
            f"data.path={str(tmp_path / 'u16.bin')!r} read as data.dtype=uint32 holds the id "
            f"{top}, over data.vocab's limit of 1048576 ids: if it holds uint16 ids (each of these "
            f"is two of them), set data.dtype=uint16 (its ids are then 0..{VOCAB - 1})"
        )


@pytest.mark.parametrize(
    "source, windows",
    [
        # the suite's time: data=text's token windows resume every time, and test_stream_identity makes a
        # tokenizer's ids again in another cache folder without a change
        pytest.param("tokens", "sequential", marks=EXTENDED),
        ("text", "random"),
        pytest.param("tokenizer", "sequential", marks=EXTENDED),
    ],
)
def test_a_killed_token_run_resumes_bit_exact(tmp_path, source, windows):
    """Killed two steps after its checkpoint and resumed, a run ends with the weights, optimizer state
    and losses of a run never interrupted: the stream resumed at the window it had reached. A tokenizer's
    run resumes so after its cache of ids was deleted and made again elsewhere (another `$HOME`): the
    stream's identity is its texts and vocabulary, not the cache's files."""
    env, before_resume = None, None
    if source == "tokens":
        token_file(tmp_path / "train.bin")
        data = ["data=tokens", f"data.path={tmp_path / 'train.bin'}"]
        lm().save(tmp_path / "lm.keras")
    else:
        text_files(tmp_path)
        data = ["data=text", f"data.path={tmp_path / 'corpus' / '*.txt'}"]
        lm(256 if source == "text" else len(WORDPIECE)).save(tmp_path / "lm.keras")
    if source == "tokenizer":
        (tmp_path / "vocab.txt").write_text("\n".join(WORDPIECE) + "\n", encoding="utf-8")
        data.append(f"data.tokenizer={tmp_path / 'vocab.txt'}")
        env = {"XDG_CACHE_HOME": str(tmp_path / "cache")}

        def before_resume():
            assert os.listdir(tmp_path / "cache" / "chain" / "tokens")
            shutil.rmtree(tmp_path / "cache")
            return {"XDG_CACHE_HOME": str(tmp_path / "other_cache")}

    n, every, kill_at = 6, 3, 5
    args = [
        "mode=e2e",
        "+stages=2",
        "model=keras",
        f"model.path={tmp_path / 'lm.keras'}",
        *data,
        f"data.seq_len={SEQ}",
        f"data.windows={windows}",
        "data.batch_size=4",
        "pipeline.microbatches=2",
        "optim=adam",
        "trainer.progress=false",
        f"trainer.steps={n}",
        f"checkpoint.every={every}",
        "trainer.steps_per_call=1",
    ]
    straight, resumed = straight_and_resumed(tmp_path, args, every, kill_at, env, before_resume)
    if source == "tokenizer":  # the ids were made again, under the other cache
        assert os.listdir(tmp_path / "other_cache" / "chain" / "tokens")
    for k in range(2):
        a, b = stage_values(straight, f"stage_{k:02d}"), stage_values(resumed, f"stage_{k:02d}")
        assert set(a) == set(b)
        for key in a:
            assert np.array_equal(a[key], b[key]), (k, key)
    assert os.path.exists(os.path.join(resumed, "summary.json"))


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["mode=local"], "has a label per position (8,), which only mode=e2e learns"),
        (["model=mlp"], "the last stage must output logits per position, shape (8, 40), which model=mlp does not"),
    ],
)
def test_labels_per_position_need_e2e_and_a_model_that_outputs_them(tmp_path, overrides, message):
    """Refused in one line (mode=local before TensorFlow starts), not a shape error in the first step."""

    token_file(tmp_path / "train.bin")
    with pytest.raises(chain.ConfigError, match=re.escape(message)):
        chain.build(
            chain.compose(
                [
                    "mode=e2e",
                    "+stages=2",
                    "data=tokens",
                    f"data.path={tmp_path / 'train.bin'}",
                    f"data.seq_len={SEQ}",
                    *overrides,
                ]
            )
        )


def text_files(root) -> bytes:
    """Three UTF-8 files (one empty, characters of 1 to 3 bytes) and their bytes in sorted order."""
    (root / "corpus").mkdir()
    texts = {
        "b.txt": "déjà vu: ünïcödé → ok. " * 12,
        "a.txt": "the quick brown fox jumps over the lazy dog\n" * 9,
        "c.txt": "",
    }
    for name, text in texts.items():
        (root / "corpus" / name).write_text(text, encoding="utf-8")
    return b"".join(texts[k].encode() for k in sorted(texts))


def test_text_is_its_utf8_bytes_in_sorted_file_order_across_file_boundaries(tmp_path):
    data = np.frombuffer(text_files(tmp_path), np.uint8)
    run = chain.build(
        chain.compose(
            [
                "mode=e2e",
                "+stages=2",
                "data=text",
                f"data.path={tmp_path / 'corpus' / '*.txt'}",
                f"data.seq_len={SEQ}",
                "data.batch_size=5",
                "data.shuffle=false",
                "data.val_fraction=0",
                "trainer.progress=false",
            ]
        ),
        model=lm(256),
    )
    assert run.dataset.targets[0].classes == 256 and run.dataset.info.examples == (len(data) - 1) // SEQ
    x, y = take(run, 15)  # 75 windows: past the end of a.txt (405 bytes) into b.txt
    assert len(data) > 75 * SEQ + 1 > 405
    np.testing.assert_array_equal(x, windows_of(data, range(0, 75 * SEQ, SEQ))[0])
    np.testing.assert_array_equal(y, windows_of(data, range(0, 75 * SEQ, SEQ))[1])


def test_a_file_that_is_not_utf8_is_one_line(tmp_path):
    text_files(tmp_path)
    (tmp_path / "corpus" / "d.txt").write_bytes(b"ok \xff\xfe then")
    with pytest.raises(chain.ConfigError, match=r"d.txt is not UTF-8 text \(byte 3 is 0xff\)"):
        chain.prepare(["mode=e2e", "data=text", f"data.path={tmp_path / 'corpus' / '*.txt'}", f"data.seq_len={SEQ}"])
