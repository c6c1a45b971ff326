"""Examples of different lengths: `data=text data.examples=lines` in length buckets (`data.buckets`). Oracles:
the same `model=gpt` on one device (Keras' own `train_on_batch`, its loss ignoring the padding id 0) on the
same batches; the step's traces counted per bucket; a resumed run's checkpoints bit for bit; config errors
one line naming the key."""

from __future__ import annotations

import random

import keras
import numpy as np
import pytest

import chain
from chain.errors import ConfigError
from compare import assert_trained_like_keras
from conftest import read_summary, stage_values, straight_and_resumed

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
        (["ignore_class=3"], "ignore_class=3, but data.examples=lines pads its targets with id 0"),
    ],
)
def test_bad_buckets_are_one_line_naming_the_key(lines, overrides, message):
    with pytest.raises(ConfigError, match=message.replace("[", r"\[").replace("]", r"\]")):
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
