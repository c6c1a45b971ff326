"""Streaming TFRecord shards (`data.stream=true`): records read while training, never loaded into
NumPy. Host memory stays bounded by the buffers (a data set several times larger than the memory a
run may add), the stream's iterator is part of every checkpoint (a resumed run equals the
uninterrupted one bit for bit), and what the stream needs up front is said in one line."""

from __future__ import annotations

import os
import threading
import time

import numpy as np
import pytest
import tensorflow as tf

import chain
import chain.spec
from chain.errors import ConfigError
from conftest import manifest, run_cli, stage_values

D = 4096  # floats per example of the large shards: 16 KB a record
TINY = ["+stages=2", "model.width=8", "model.depth=1", "trainer.progress=false", "data=tfrecord", "data.y=y",
        "data.stream=true", "data.classes={label: 2}"]


def _templates(width: int) -> list[tuple[bytes, bytes]]:
    """A serialized `tf.train.Example` {x: float32[width], y: int64} around its x, per label 0 and 1:
    records are the two halves around x's bytes (packed floats), so writing one costs no protobuf."""
    x = np.arange(1, width + 1, dtype="float32")
    out = []
    for label in (0, 1):
        f = {"x": tf.train.Feature(float_list=tf.train.FloatList(value=x)),
             "y": tf.train.Feature(int64_list=tf.train.Int64List(value=[label]))}
        b = tf.train.Example(features=tf.train.Features(feature=f)).SerializeToString()
        at = b.find(x.tobytes())
        out.append((b[:at], b[at + x.nbytes:]))
    return out


def write_shards(root, shards: int, per: int, width: int, seed: int = 0) -> None:
    """`shards` files of `per` examples {x: `width` uniform floats, y: x[0] > 0.5}."""
    os.makedirs(root, exist_ok=True)
    halves, rng = _templates(width), np.random.default_rng(seed)
    for s in range(shards):
        x = rng.random((per, width), dtype=np.float32)
        with tf.io.TFRecordWriter(os.path.join(root, f"part-{s:03d}.tfrecord")) as w:
            for row in x:
                head, tail = halves[int(row[0] > 0.5)]
                w.write(head + row.tobytes() + tail)


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def peak_rss_growth(work) -> tuple[object, int]:
    """`work()`'s result and how far this process's resident memory rose above where it started
    while `work` ran (sampled every 5 ms)."""
    base, peak, done = _rss(), [0], threading.Event()

    def sample():
        while not done.is_set():
            peak[0] = max(peak[0], _rss())
            time.sleep(0.005)

    t = threading.Thread(target=sample, daemon=True)
    t.start()
    try:
        result = work()
    finally:
        done.set()
        t.join()
    return result, max(peak[0], _rss()) - base


def test_a_stream_several_times_larger_than_its_memory_bound_trains_and_evaluates(tmp_path):
    big, small = tmp_path / "big", tmp_path / "small"
    write_shards(big, shards=48, per=250, width=D)  # 12000 records, 188 MB
    write_shards(small, shards=2, per=250, width=D, seed=1)
    size = sum(os.path.getsize(big / f) for f in os.listdir(big))
    args = [*TINY, "data.batch_size=100", "data.shuffle_buffer=100", f"data.features={{x: 'float32[{D}]', y: int64}}",
            "trainer.epochs=1", "data.val_fraction=0.1"]

    def fit(root):
        return lambda: chain.build(chain.compose([*args, f"data.files={root}/*.tfrecord"])).fit()

    peak_rss_growth(fit(small))  # the same run on 2 files: TensorFlow's and Keras' one-time costs paid first
    summary, grew = peak_rss_growth(fit(big))
    # 5 of 48 files held out (round(4.8)); an epoch of the other 43 x 250 records: 108 batches of 100.
    assert (summary["train_examples"], summary["val_examples"], summary["steps"]) == (10750, 1250, 108)
    assert set(summary["stages"][1]["val"]) == {"loss", "accuracy"}  # evaluated on the streamed held-out files
    assert np.isfinite(summary["loss_last"])
    # Loading the records (data.stream=false) adds more than their size (about 2.3x, measured); streaming
    # adds the buffers: a batch, the shuffle buffer, the chunks and batches read ahead (about 26 MB, measured
    # on 125 MB of these records).
    assert grew < size / 4, f"resident memory rose {grew / 2**20:.0f} MB over a run on {size / 2**20:.0f} MB of records"


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    root = tmp_path_factory.mktemp("shards")
    write_shards(root, shards=4, per=40, width=8)
    return str(root)


def small(shards, *more):
    return chain.compose([*TINY, f"data.files={shards}/*.tfrecord", "data.features={x: 'float32[8]', y: int64}",
                          "data.batch_size=16", "data.shuffle_buffer=24", "model.dropout=0.2", *more])


def test_a_stream_killed_and_resumed_equals_the_uninterrupted_run(shards, tmp_path):
    n, every, kill_at = 14, 4, 10  # past an epoch (120 training records: 7 batches), killed 2 steps after a save
    straight, resumed = str(tmp_path / "straight"), str(tmp_path / "resumed")
    args = [*TINY, f"data.files={shards}/*.tfrecord", "data.features={x: 'float32[8]', y: int64}", "data.batch_size=16",
            "data.shuffle_buffer=24", "model.dropout=0.2", f"trainer.steps={n}", f"checkpoint.every={every}"]
    r = run_cli(tmp_path, *args, f"hydra.run.dir={resumed}", env={"CHAIN_TEST_KILL_AT_STEP": str(kill_at)})
    assert r.returncode == -9, r.stderr  # SIGKILL after step 10: no cleanup ran
    assert manifest(resumed)["step"] == 8
    chain.build(chain.compose(args), run_dir=straight).fit()
    summary = chain.build(chain.compose([*args, "resume=true"]), run_dir=resumed).fit()
    assert summary["resumed_from"] == 8 and summary["skipped_records"] == 0
    for k in range(2):
        a, b = stage_values(straight, f"stage_{k:02d}"), stage_values(resumed, f"stage_{k:02d}")
        assert set(a) == set(b)
        for key in a:
            assert np.array_equal(a[key], b[key]), (k, key)


@pytest.mark.parametrize("more, message", [
    (["data.classes=null"], "data.classes.label is needed with data.stream=true"),
    (["data.val_fraction=0.5", "data.files={shards}/part-000.tfrecord"],
     "data.val_fraction=0.5 with data.stream=true holds out whole files, and data.files='{shards}/part-000.tfrecord' "
     "matches 1 file"),
])
def test_what_a_stream_needs_up_front_is_one_line_naming_the_key(shards, more, message):
    with pytest.raises(ConfigError, match="^" + message.format(shards=shards).replace(".", r"\.").replace("*", r"\*")
                       .replace("(", r"\(")):
        chain.spec.check(small(shards, *[m.format(shards=shards) for m in more]))


@pytest.fixture(scope="module")
def bad_shards(tmp_path_factory):
    """3 files of 64 records {x: float32[8], y: int64}; record 9 of part-001 has no y, record 40 of
    part-002 holds 7 floats. Read in order (data.shuffle=false), a chunk of each file in turn (all its
    64 records: `record_stream` parses up to 256 small records at a time), they are the stream's 74th
    (step 10's batch of 8) and 169th (step 22's)."""
    root = tmp_path_factory.mktemp("bad_shards")
    write_shards(root, shards=3, per=64, width=8)

    def example(x, y=None):
        f = {"x": tf.train.Feature(float_list=tf.train.FloatList(value=x))}
        if y is not None:
            f["y"] = tf.train.Feature(int64_list=tf.train.Int64List(value=[y]))
        return tf.train.Example(features=tf.train.Features(feature=f)).SerializeToString()

    for name, bad, record in (("part-001", 9, example(np.ones(8))), ("part-002", 40, example(np.ones(7), 1))):
        records = [r.numpy() for r in tf.data.TFRecordDataset(str(root / f"{name}.tfrecord"))]
        records[bad] = record
        with tf.io.TFRecordWriter(str(root / f"{name}.tfrecord")) as w:
            for r in records:
                w.write(r)
    return str(root)


def test_a_bad_record_mid_run_is_one_line_naming_its_file_and_keeps_the_last_checkpoint(bad_shards, tmp_path):
    s = small(bad_shards, "data.shuffle=false", "data.val_fraction=0", "trainer.steps=24", "checkpoint.every=4")
    with pytest.raises(ConfigError) as e:
        chain.build(s, run_dir=str(tmp_path)).fit()
    assert e.value.exit_code == 2
    # The first bad record read is record 9 of part-001 (no y), in step 10's batch: the run stops there,
    # or at an earlier save if the records read ahead, which a save holds, had reached it.
    text = str(e.value)
    assert "\n" not in text and text.startswith(
        f"data.files: record 9 of {bad_shards}/part-001.tfrecord is not as data.features declares it: feature y "
        "holds 0 values, declared int64 (data.on_bad_record=skip leaves such records out); "), text
    if text.endswith("no checkpoint had been saved"):
        assert not os.path.exists(tmp_path / "checkpoint.json")
    else:
        step = manifest(tmp_path)["step"]
        assert step in (4, 8) and text.endswith(f"the last complete checkpoint (step {step}) is intact")


def test_a_record_of_the_wrong_shape_names_the_feature(bad_shards):
    from chain.data.record_stream import bad_record, training
    from chain.data.sources.tfrecord_data import shards

    s = small(bad_shards, "data.shuffle=false", "data.val_fraction=0", f"data.files={bad_shards}/part-002.tfrecord")
    files = shards(s.data)
    stream = iter(training(files, 8, False, 0))
    with pytest.raises(tf.errors.InvalidArgumentError) as e:
        for _ in range(6):  # record 40 is in the 6th batch
            next(stream)
    assert bad_record(e.value, files) == (
        f"data.files: record 40 of {bad_shards}/part-002.tfrecord is not as data.features declares it: feature x "
        "holds 7 values, declared float32[8] (data.on_bad_record=skip leaves such records out)")


def test_on_bad_record_skip_counts_the_records_left_out(bad_shards, tmp_path):
    summary = chain.build(small(bad_shards, "data.on_bad_record=skip", "data.val_fraction=0", "trainer.steps=14"),
                          run_dir=str(tmp_path)).fit()
    # 14 batches of 8 and the shuffle buffer (24) take 136 records, more than 2 files: both bad records
    # are read, whatever the files' order. The count is of records read, read-ahead included.
    assert summary["steps"] == 14 and np.isfinite(summary["loss_last"]) and summary["skipped_records"] >= 2


def test_a_damaged_record_or_a_feature_of_another_type_is_one_line(tmp_path):
    from chain.data.record_stream import bad_record, training
    from chain.data.sources.tfrecord_data import shards

    write_shards(tmp_path, shards=1, per=20, width=8)
    whole = (tmp_path / "part-000.tfrecord").read_bytes()
    damaged = bytearray(whole)
    damaged[200] ^= 0xFF  # inside record 2's data: its checksum fails
    y_float = tf.train.Example(features=tf.train.Features(feature={
        "x": tf.train.Feature(float_list=tf.train.FloatList(value=np.ones(8))),
        "y": tf.train.Feature(float_list=tf.train.FloatList(value=[1.0]))})).SerializeToString()
    lines = []
    for name, write in (("damaged", lambda p: p.write_bytes(bytes(damaged))),
                        ("typed", lambda p: _rewrite(p, whole, 3, y_float))):
        (tmp_path / name).mkdir()
        write(tmp_path / name / "part-000.tfrecord")
        s = small(str(tmp_path / name), "data.shuffle=false", "data.val_fraction=0", "data.batch_size=4")
        files = shards(s.data)
        stream = iter(training(files, 4, False, 0))
        with pytest.raises(tf.errors.OpError) as e:
            for _ in range(5):
                next(stream)
        lines.append(bad_record(e.value, files))
    end = ": a damaged record, or a feature whose type is not the one data.features declares; TensorFlow does not say in which file"
    assert lines == ["data.files: a record cannot be read (corrupted record at 158)" + end,
                     "data.files: a record cannot be read (Key: y, Index: 3. Data types don't match. Expected type: int64, Actual "
                     "type: float)" + end]


def _rewrite(path, whole: bytes, i: int, record: bytes) -> None:
    """`whole`'s records written to `path`, record `i` replaced by `record`."""
    path.with_suffix(".src").write_bytes(whole)
    records = [r.numpy() for r in tf.data.TFRecordDataset(str(path.with_suffix(".src")))]
    records[i] = record
    with tf.io.TFRecordWriter(str(path)) as w:
        for r in records:
            w.write(r)



def _late(x, ys):
    """The batch, 40 ms later (a sleep on the host, outside TensorFlow's math)."""
    pause = tf.py_function(lambda: time.sleep(0.04) or 0.0, [], tf.float32)
    pause.set_shape([])
    return x + tf.cast(pause, x.dtype) * 0, ys


@pytest.mark.parametrize("per_call", [8, 1])  # the batch taken inside the compiled loop, or on the host
def test_a_slow_stream_shows_in_data_wait_ms(per_call):
    args = ["+stages=2", "model.width=8", "model.depth=1", "trainer.progress=false", "trainer.steps=16",
            f"trainer.steps_per_call={per_call}", "data.val_fraction=0"]
    waits = {}
    for slow in (False, True):
        run = chain.build(chain.compose(args))
        if slow:  # every batch 40 ms late: the step (about 1 ms) waits for it
            batches = run.batches
            run.batches = lambda: batches().map(_late)
        waits[slow] = run.fit()["data_wait_ms"]
    fast, slow = waits[False], waits[True]
    # Every call but the first is timed: the second call's 8 steps, or 15 calls of one step.
    assert fast["steps"] == slow["steps"] == (8 if per_call == 8 else 15)
    assert 0 <= fast["mean"] <= fast["p95"] and 0 <= slow["mean"] <= slow["p95"]
    assert slow["mean"] > 25 and slow["mean"] > 3 * fast["mean"], waits


def test_the_stream_is_a_function_of_seed_and_files_and_changes_every_epoch(shards):
    from chain.data.record_stream import training
    from chain.data.sources.tfrecord_data import shards as shards_of

    files = shards_of(small(shards, "data.val_fraction=0").data)  # 4 files of 40 records, x[1] distinct

    def seen(seed, n):  # the first n batches' examples, each named by its x[1]
        it = iter(training(files, 16, True, seed))
        return np.concatenate([next(it)[0].numpy()[:, 1] for _ in range(n)])

    a, b, other = seen(0, 20), seen(0, 20), seen(1, 20)
    assert np.array_equal(a, b) and not np.array_equal(a, other)
    first, second = a[:160], a[160:]
    assert len(set(first)) > 150 and len(set(second)) > 150  # an epoch holds (nearly) every record once:
    assert not np.array_equal(first, second)  # epochs blur only at their border; shuffled anew on the second
