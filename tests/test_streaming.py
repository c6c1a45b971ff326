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
import chain.prepared
from chain.errors import ConfigError
from conftest import manifest, run_cli, stage_values

D = 4096  # floats per example of the large shards: 16 KB a record
TINY = [
    "+stages=2",
    "model.width=8",
    "model.depth=1",
    "trainer.progress=false",
    "data=tfrecord",
    "data.y=y",
    "data.stream=true",
    "data.classes={label: 2}",
]


def _templates(width: int) -> list[tuple[bytes, bytes]]:
    """A serialized `tf.train.Example` {x: float32[width], y: int64} around its x, per label 0 and 1:
    records are the two halves around x's bytes (packed floats), so writing one costs no protobuf."""
    x = np.arange(1, width + 1, dtype="float32")
    out = []
    for label in (0, 1):
        f = {
            "x": tf.train.Feature(float_list=tf.train.FloatList(value=x)),
            "y": tf.train.Feature(int64_list=tf.train.Int64List(value=[label])),
        }
        b = tf.train.Example(features=tf.train.Features(feature=f)).SerializeToString()
        at = b.find(x.tobytes())
        out.append((b[:at], b[at + x.nbytes :]))
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
    args = [
        *TINY,
        "data.batch_size=100",
        "data.shuffle_buffer=100",
        f"data.features={{x: 'float32[{D}]', y: int64}}",
        "trainer.epochs=1",
        "data.val_fraction=0.1",
    ]

    def fit(root):
        return lambda: chain.build(chain.compose([*args, f"data.path={root}/*.tfrecord"])).fit()

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
    return chain.compose(
        [
            *TINY,
            f"data.path={shards}/*.tfrecord",
            "data.features={x: 'float32[8]', y: int64}",
            "data.batch_size=16",
            "data.shuffle_buffer=24",
            "model.dropout=0.2",
            *more,
        ]
    )


def test_a_stream_killed_and_resumed_equals_the_uninterrupted_run(shards, tmp_path):
    n, every, kill_at = 14, 4, 10  # past an epoch (120 training records: 7 batches), killed 2 steps after a save
    straight, resumed = str(tmp_path / "straight"), str(tmp_path / "resumed")
    args = [
        *TINY,
        f"data.path={shards}/*.tfrecord",
        "data.features={x: 'float32[8]', y: int64}",
        "data.batch_size=16",
        "data.shuffle_buffer=24",
        "model.dropout=0.2",
        f"trainer.steps={n}",
        f"checkpoint.every={every}",
    ]
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


@pytest.mark.parametrize(
    "more, message",
    [
        (["data.classes=null"], "data.classes.label is needed with data.stream=true"),
        (
            ["data.val_fraction=0.5", "data.path={shards}/part-000.tfrecord"],
            "data.val_fraction=0.5 with data.stream=true holds out whole files, and data.path='{shards}/part-000.tfrecord' "
            "matches 1 file",
        ),
    ],
)
def test_what_a_stream_needs_up_front_is_one_line_naming_the_key(shards, more, message):
    with pytest.raises(
        ConfigError,
        match="^" + message.format(shards=shards).replace(".", r"\.").replace("*", r"\*").replace("(", r"\("),
    ):
        chain.prepared.check_config(small(shards, *[m.format(shards=shards) for m in more]))


@pytest.fixture(scope="module")
def odd_files(tmp_path_factory):
    """Folders of files to stream, each with one file that is empty or unlike the others."""
    root = tmp_path_factory.mktemp("odd")
    for name in ("empty_train", "empty_val", "wider", "typed"):
        write_shards(root / name, shards=3, per=8, width=8)
    (root / "empty_train" / "part-001.tfrecord").write_bytes(b"")
    (root / "empty_val" / "part-002.tfrecord").write_bytes(b"")  # the file data.val_fraction holds out
    write_shards(root / "narrow", shards=1, per=8, width=4)
    os.replace(root / "narrow" / "part-000.tfrecord", root / "wider" / "part-001.tfrecord")
    y_float = tf.train.Example(
        features=tf.train.Features(
            feature={
                "x": tf.train.Feature(float_list=tf.train.FloatList(value=np.ones(8))),
                "y": tf.train.Feature(float_list=tf.train.FloatList(value=[1.0])),
            }
        )
    ).SerializeToString()
    with tf.io.TFRecordWriter(str(root / "typed" / "part-001.tfrecord")) as w:
        for _ in range(8):
            w.write(y_float)
    write_csv(root / "csv", files=3, rows=10)
    (root / "csv" / "part-2.csv").write_text("a,b,c,d,y\n")  # a header, no rows
    np.savez(root / "none.npz", x=np.zeros((0, 6), "float32"), y=np.zeros(0, "int64"))
    np.savez(root / "some.npz", x=np.ones((40, 6), "float32"), y=np.arange(40) % 2)
    return str(root)


EVERY = "every file streamed holds at least one: remove it, or change"
FIRST = "(each file's first record is checked before training)"
TFRECORD = "data.features={x: 'float32[8]', y: int64}"


@pytest.mark.parametrize(
    "more, message",
    [
        (
            ["data.path={root}/empty_train/*.tfrecord", "data.val_fraction=0"],
            f"data.path: {{root}}/empty_train/part-001.tfrecord holds no records; {EVERY} data.path",
        ),
        (
            [
                "data.path={root}/empty_val/*.tfrecord",
                "data.val_fraction=0.3",
            ],  # issue 39: 20 steps, then ZeroDivisionError
            f"data.path: {{root}}/empty_val/part-002.tfrecord holds no records, and it is held out for validation (the last "
            f"1 file(s) of data.path in sorted order); {EVERY} data.path",
        ),
        (
            ["data.path={root}/wider/part-000.tfrecord", "data.val_path={root}/empty_val/part-002.tfrecord"],
            f"data.val_path: {{root}}/empty_val/part-002.tfrecord holds no records; {EVERY} data.val_path",
        ),
        (
            ["data.path={root}/wider/*.tfrecord", "data.val_fraction=0"],
            f"data.path: record 0 of {{root}}/wider/part-001.tfrecord is not as data.features declares it: feature x holds 4 "
            f"values, declared float32[8] {FIRST}",
        ),
        (
            ["data.path={root}/typed/*.tfrecord", "data.val_fraction=0.3"],
            f"data.path: record 0 of {{root}}/typed/part-001.tfrecord is not as data.features declares it: feature y holds 1 "
            f"float32 values, declared int64 {FIRST}",
        ),
        (
            ["data=csv", "data.path={root}/csv/*.csv", "data.val_fraction=0.3"],
            f"data.path: {{root}}/csv/part-2.csv holds no rows, and it is held out for validation (the last 1 file(s) of "
            f"data.path in sorted order); {EVERY} data.path",
        ),
        (
            ["data=npz", "data.path={root}/some.npz", "data.val_path={root}/none.npz"],
            "data.val_path='{root}/none.npz': its arrays hold no rows (x: (0, 6)), so there is nothing to validate on; give "
            "a file that holds examples, or leave data.val_path out",
        ),
    ],
    ids=[
        "empty training file",
        "empty validation file",
        "empty data.val_path",
        "another shape",
        "another type",
        "empty csv held out",
        "npz val_path of no rows",
    ],
)
def test_an_empty_or_odd_file_is_refused_before_training_naming_it(odd_files, more, message):
    more = [m.format(root=odd_files) for m in more]
    kind = [m for m in more if m.startswith("data=")]
    args = [
        *TINY[:4],
        *(kind or ["data=tfrecord", TFRECORD]),
        "data.y=y",
        "data.stream=true",
        "data.classes={label: 2}",
        "data.batch_size=4",
        *[m for m in more if not m.startswith("data=")],
    ]
    with pytest.raises(ConfigError) as e:
        chain.prepared.check_config(chain.compose(args))
    assert str(e.value) == message.format(root=odd_files)


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
        f"data.path: record 9 of {bad_shards}/part-001.tfrecord is not as data.features declares it: feature y "
        "holds 0 values, declared int64 (data.on_bad_record=skip leaves such records out); "
    ), text
    if text.endswith("no checkpoint had been saved"):
        assert not os.path.exists(tmp_path / "checkpoint.json")
    else:
        step = manifest(tmp_path)["step"]
        assert step in (4, 8) and text.endswith(f"the last complete checkpoint (step {step}) is intact")


@pytest.mark.parametrize("chunk", [256, 16])  # record 40: in the first chunk, or 8 records into the third
def test_a_record_of_the_wrong_shape_names_the_feature(bad_shards, chunk, monkeypatch):
    from chain.data import chunks
    from chain.data.sources.tfrecord.tfrecord_stream import bad_record, training
    from chain.data.sources.tfrecord.tfrecord_data import shards

    monkeypatch.setattr(chunks, "MAX_CHUNK", chunk)  # a chunk says its file and first record's number once
    s = small(bad_shards, "data.shuffle=false", "data.val_fraction=0", f"data.path={bad_shards}/part-002.tfrecord")
    files = shards(s.data)
    stream = iter(training(files, 8, False, 0))
    with pytest.raises(tf.errors.InvalidArgumentError) as e:
        for _ in range(6):  # record 40 is in the 6th batch
            next(stream)
    assert bad_record(e.value, files) == (
        f"data.path: record 40 of {bad_shards}/part-002.tfrecord is not as data.features declares it: feature x "
        "holds 7 values, declared float32[8] (data.on_bad_record=skip leaves such records out)"
    )


def test_a_chunk_whose_extra_and_missing_values_even_out_is_still_bad():
    # One record with 9 floats, one with 7: the chunk holds as many values as 8 floats a record.
    from chain.data.sources.tfrecord.tfrecord_stream import _BAD, _parse_chunk
    from chain.data.sources.tfrecord.tfrecord_record import Shards

    def example(width):
        f = {
            "x": tf.train.Feature(float_list=tf.train.FloatList(value=np.ones(width))),
            "y": tf.train.Feature(int64_list=tf.train.Int64List(value=[1])),
        }
        return tf.train.Example(features=tf.train.Features(feature=f)).SerializeToString()

    files = Shards(("f",), (4,), (), (), (("x", ("float32", (8,))), ("y", ("int64", ()))), "x", (("label", "y", 2),), 8)
    chunk = (tf.constant("f"), tf.constant(32, tf.int64), tf.constant([example(w) for w in (8, 9, 7, 8)]))
    _, _, ok = tf.function(_parse_chunk(files, skip=True))(*chunk)
    assert ok.numpy().tolist() == [True, False, False, True]
    with pytest.raises(tf.errors.InvalidArgumentError) as e:
        tf.function(_parse_chunk(files, skip=False))(*chunk)  # as in the stream: a graph
    assert _BAD.search(str(e.value)).groups()[:2] == ("f", "33")


def test_on_bad_record_skip_counts_the_records_left_out(bad_shards, tmp_path):
    summary = chain.build(
        small(bad_shards, "data.on_bad_record=skip", "data.val_fraction=0", "trainer.steps=14"), run_dir=str(tmp_path)
    ).fit()
    # 14 batches of 8 and the shuffle buffer (24) take 136 records, more than 2 files: both bad records
    # are read, whatever the files' order. The count is of records read, read-ahead included.
    assert summary["steps"] == 14 and np.isfinite(summary["loss_last"]) and summary["skipped_records"] >= 2


def test_a_damaged_record_or_a_feature_of_another_type_is_one_line(tmp_path):
    from chain.data.sources.tfrecord.tfrecord_stream import bad_record, training
    from chain.data.sources.tfrecord.tfrecord_data import shards

    write_shards(tmp_path, shards=1, per=20, width=8)
    whole = (tmp_path / "part-000.tfrecord").read_bytes()
    damaged = bytearray(whole)
    damaged[200] ^= 0xFF  # inside record 2's data: its checksum fails
    y_float = tf.train.Example(
        features=tf.train.Features(
            feature={
                "x": tf.train.Feature(float_list=tf.train.FloatList(value=np.ones(8))),
                "y": tf.train.Feature(float_list=tf.train.FloatList(value=[1.0])),
            }
        )
    ).SerializeToString()
    lines = []
    for name, write in (
        ("damaged", lambda p: p.write_bytes(bytes(damaged))),
        ("typed", lambda p: _rewrite(p, whole, 3, y_float)),
    ):
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
    # TensorFlow names the damaged record's byte offset only (its data's, 12 bytes into record 2 of 73 bytes)
    assert lines == [
        f"data.path: record 2 of {tmp_path}/damaged/part-000.tfrecord is damaged: its checksum fails "
        "(TensorFlow: corrupted record at byte 158); write the file again, or leave it out "
        "(data.on_bad_record=skip does not leave out a damaged record)",
        "data.path: a record cannot be read (Key: y, Index: 3. Data types don't match. Expected type: int64, Actual "
        "type: float)" + end,
    ]


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
    args = [
        "+stages=2",
        "model.width=8",
        "model.depth=1",
        "trainer.progress=false",
        "trainer.steps=16",
        f"trainer.steps_per_call={per_call}",
        "data.val_fraction=0",
    ]
    waits = {}
    for slow in (False, True):
        run = chain.build(chain.compose(args))
        if slow:  # every batch 40 ms late: the step (about 1 ms) waits for it
            batches = run.batches
            run.batches = lambda batches=batches: batches().map(_late)
        waits[slow] = run.fit()["data_wait_ms"]
    fast, slow = waits[False], waits[True]
    # Every call but the first is timed: the second call's 8 steps, or 15 calls of one step.
    assert fast["steps"] == slow["steps"] == (8 if per_call == 8 else 15)
    assert 0 <= fast["mean"] <= fast["p95"] and 0 <= slow["mean"] <= slow["p95"]
    assert slow["mean"] > 25 and slow["mean"] > 3 * fast["mean"], waits


def test_the_stream_is_a_function_of_seed_and_files_and_changes_every_epoch(shards):
    from chain.data.sources.tfrecord.tfrecord_stream import training
    from chain.data.sources.tfrecord.tfrecord_data import shards as shards_of

    files = shards_of(small(shards, "data.val_fraction=0").data)  # 4 files of 40 records, x[1] distinct

    def seen(seed, n):  # the first n batches' examples, each named by its x[1]
        it = iter(training(files, 16, True, seed))
        return np.concatenate([next(it)[0].numpy()[:, 1] for _ in range(n)])

    a, b, other = seen(0, 20), seen(0, 20), seen(1, 20)
    assert np.array_equal(a, b) and not np.array_equal(a, other)
    first, second = a[:160], a[160:]
    assert len(set(first)) > 150 and len(set(second)) > 150  # an epoch holds (nearly) every record once:
    assert not np.array_equal(first, second)  # epochs blur only at their border; shuffled anew on the second


def _read_ahead(stream: tf.data.Dataset) -> int:
    """The buffer of the stream's last prefetch (the batches it reads ahead), from its graph."""
    from tensorflow.core.framework import graph_pb2

    graph = graph_pb2.GraphDef.FromString(stream._as_serialized_graph().numpy())
    nodes = {n.name: n for n in graph.node}
    node = next(n for n in graph.node if n.op == "_Retval")
    while node.op != "PrefetchDataset":  # past the options
        node = nodes[node.input[0].split(":")[0]]
    return int(tf.make_ndarray(nodes[node.input[1].split(":")[0]].attr["value"].tensor))


def test_the_stream_reads_a_group_of_batches_ahead(shards):
    # Its work comes in bursts, a group of data.shuffle_buffer examples at a time: with fewer batches
    # read ahead, a short step waits for every burst (docs/your-data.md, "Speed").
    from chain.data.sources.tfrecord.tfrecord_stream import training
    from chain.data.sources.tfrecord.tfrecord_data import shards as shards_of

    files = shards_of(small(shards, "data.val_fraction=0", "data.shuffle_buffer=100").data)
    for batch in (4, 16, 200):
        assert _read_ahead(training(files, batch, True, 0)) == max(2, -(-100 // batch)), batch


def _inputs(path) -> np.ndarray:
    """The x of every record of a file, in the file's order."""
    spec = {"x": tf.io.FixedLenFeature([8], tf.float32)}
    chunks = tf.data.TFRecordDataset(path).batch(64)
    return np.concatenate([tf.io.parse_example(rs, spec)["x"].numpy() for rs in chunks])


def test_mirrored_replicas_stream_their_own_files_and_train_as_on_those_examples(shards, tmp_path):
    """placement.fallback=mirrored over 2 replicas: replica r reads only the training files r, r+2, ...
    (its part of every batch comes from them), as a stream of a data set of just its files would; a
    checkpoint of the stream holds both replicas' positions (a run resumed from it trains on the batches
    that followed); the run trains as the one-device chain on those batches and evaluates on every
    validation record."""
    from dataclasses import replace

    from chain.data.sources.tfrecord import tfrecord_stream
    from compare import assert_same_start, rel_diff, weights
    from conftest import DEVICES

    steps = 4
    args = [
        *TINY,
        f"data.path={shards}/*.tfrecord",
        "data.features={x: 'float32[8]', y: int64}",
        "data.batch_size=16",
        "data.shuffle_buffer=24",
        "data.val_fraction=0.25",
        f"trainer.steps={steps}",
    ]
    mirrored = chain.build(chain.compose([*args, "placement.fallback=mirrored"]))
    single = chain.build(chain.compose([*args, f"placement.devices=[{DEVICES[2]},{DEVICES[2]}]"]))
    assert_same_start(mirrored, single)
    files = mirrored.dataset.shards
    assert len(files.paths) == 3  # part-003 held out: replica 0 reads part-000 and -002, replica 1 part-001
    owner = {row.tobytes(): j % 2 for j, path in enumerate(files.paths) for row in _inputs(path)}
    it = mirrored.iterator  # the run's own stream, the one its checkpoints save
    batches = [next(it) for _ in range(2)]
    saved = tf.train.Checkpoint(stream=it).write(str(tmp_path / "stream"))
    batches += [next(it) for _ in range(steps)]
    seen = [[], []]
    for x, _ in batches:
        for r, part in enumerate(np.split(x.numpy(), 2)):
            assert {owner[row.tobytes()] for row in part} == {r}  # each replica's part from its own files only
            seen[r] += [row.tobytes() for row in part]
    # 48 of replica 0's 80 records: none twice (a second pass cannot reach past the 24-record buffer before its 57th)
    assert len(set(seen[0])) == 48
    # Each replica's part is the batch a stream of its own files alone reads, with its share of the batch.
    own = [
        iter(
            tfrecord_stream.training(
                replace(files, paths=files.paths[r::2], counts=files.counts[r::2]), 8, True, mirrored.settings.seed
            )
        )
        for r in range(2)
    ]
    for x, ys in batches:
        parts = [next(o) for o in own]
        np.testing.assert_array_equal(x.numpy(), np.concatenate([p[0].numpy() for p in parts]))
        for k in ys:
            np.testing.assert_array_equal(ys[k].numpy(), np.concatenate([p[1][k].numpy() for p in parts]))
    # The stream restored to its state after 2 batches: the run trains on batches 3-6.
    tf.train.Checkpoint(stream=it).read(saved).assert_consumed()
    summary = mirrored.fit()
    for x, ys in batches[2:]:
        single.step(x, ys)
    for a, b in zip(weights(mirrored), weights(single), strict=True):
        assert rel_diff(a, b) <= 1e-5
    # Evaluation still reads every validation record once: the one-device chain's evaluation of the same weights.
    assert summary["val_examples"] == 40
    assert summary["stages"][1]["val"]["loss"] == pytest.approx(single.evaluate().stages[1]["loss"], rel=1e-5)


def test_fewer_training_files_than_mirrored_replicas_is_one_line(shards):
    args = [
        *TINY,
        f"data.path={shards}/part-00*.tfrecord",
        "data.features={x: 'float32[8]', y: int64}",
        "data.batch_size=16",
        "data.val_fraction=0.75",
        "placement.fallback=mirrored",
    ]
    with pytest.raises(ConfigError) as e:
        chain.build(chain.compose(args))
    assert str(e.value) == (
        f"data.path='{shards}/part-00*.tfrecord' gives 1 training file(s) (after the files data.val_fraction "
        "holds out), and with data.stream=true each of the 2 mirrored replicas reads files of its own: give data.path "
        "at least 2 training files, or data.stream=false"
    )


# --- CSV, .npz and the user's dataset streamed (issue 20: every file source) ---------------------

CSV = [
    "+stages=2",
    "model.width=8",
    "model.depth=1",
    "trainer.progress=false",
    "data=csv",
    "data.y=y",
    "data.stream=true",
    "data.classes={label: 2}",
    "data.batch_size=16",
    "data.shuffle_buffer=24",
    "model.dropout=0.2",
    "data.val_fraction=0",
]


def write_csv(root, files: int, rows: int, seed: int = 0) -> None:
    """`files` CSV files of `rows` rows: columns a..d uniform, y = a > 0.5; a blank line inside each."""
    os.makedirs(root, exist_ok=True)
    rng = np.random.default_rng(seed)
    for k in range(files):
        x = rng.random((rows, 4))
        lines = ["a,b,c,d,y"] + [",".join(f"{v:.6f}" for v in r) + f",{int(r[0] > 0.5)}" for r in x]
        lines.insert(rows // 2, "")
        (root / f"part-{k}.csv").write_text("\n".join(lines) + "\n")


@pytest.fixture(scope="module")
def csv_files(tmp_path_factory):
    root = tmp_path_factory.mktemp("csv")
    write_csv(root, files=3, rows=40)
    return root


def _weights_equal(a_dir, b_dir) -> None:
    for k in range(2):
        a, b = stage_values(a_dir, f"stage_{k:02d}"), stage_values(b_dir, f"stage_{k:02d}")
        assert set(a) == set(b)
        for key in a:
            assert np.array_equal(a[key], b[key]), (k, key)


def _resumes_exact(stream, tmp_path, steps: int = 4) -> None:
    """The iterator `stream`, saved in a checkpoint and restored, gives the same batches again, bit for bit
    (what a resumed run's stream does: `Run` saves its iterator in every checkpoint)."""
    checkpoint = tf.train.Checkpoint(it=stream)
    saved = checkpoint.save(str(tmp_path / "it" / "c"))
    after = [tf.nest.map_structure(lambda t: t.numpy(), next(stream)) for _ in range(steps)]
    checkpoint.restore(saved)
    for a in after:
        b = next(stream)
        assert np.array_equal(a[0], b[0].numpy()) and all(np.array_equal(a[1][k], b[1][k].numpy()) for k in a[1])


def test_a_csv_stream_trains_and_resumes_bit_exact(csv_files, tmp_path, caplog):
    from chain.data import count_cache
    from chain.data.sources.csv import csv_stream
    from chain.data.sources.csv.csv_data import shards as csv_shards

    count_cache.forget()
    with caplog.at_level("INFO", logger="chain"):
        s = chain.compose([*CSV, f"data.path={csv_files}/*.csv", "trainer.steps=3"])
        summary = chain.build(s).fit()
    # 3 files of 40 rows (a blank line in each, left out)
    assert (summary["train_examples"], summary["steps"]) == (120, 3) and np.isfinite(summary["loss_last"])
    assert "counting the csv rows of 3 file(s)" in caplog.text
    files = csv_shards(s.data)
    stream = iter(csv_stream.training(files, 16, True, 3))
    epoch = np.concatenate([next(stream)[0].numpy() for _ in range(7)])  # 112 of the 120 rows
    assert len(np.unique(epoch, axis=0)) == 112  # no row twice in an epoch
    _resumes_exact(stream, tmp_path)  # mid-epoch 2, the shuffle buffer full


def test_the_count_cache_spares_a_second_run_the_count(csv_files, shards, caplog):
    from chain.data import count_cache

    for s in (chain.compose([*CSV, f"data.path={csv_files}/*.csv"]), small(shards)):
        chain.prepared.check_config(
            s
        )  # counted (or cached by an earlier test): the counts are on disk beside the files
        count_cache.forget()  # a new process: nothing in memory
        caplog.clear()
        with caplog.at_level("INFO", logger="chain"):
            chain.prepared.check_config(s)
        assert (
            "counting" not in caplog.text
            and "file(s) of data." in caplog.text
            and "from the count cache" in caplog.text
        ), caplog.text
    assert os.path.exists(os.path.join(csv_files, count_cache.NAME))


def test_a_csv_stream_over_mirrored_replicas_is_one_line(csv_files):
    # Only TFRecord streams are read in replicas' shares: another stream would be cut wrongly, so it is refused.
    with pytest.raises(ConfigError) as e:
        chain.build(chain.compose([*CSV, f"data.path={csv_files}/part-*.csv", "placement.fallback=mirrored"]))
    assert str(e.value).startswith(
        "data.stream=true with 2 mirrored replicas: each replica reads files of its own, "
        "which only data=tfrecord streams do so far"
    )


@pytest.fixture(scope="module")
def bad_csv(tmp_path_factory):
    """2 files of 30 rows: line 12 of part-0 holds 'x7' in column c, line 20 of part-1 has 4 fields."""
    root = tmp_path_factory.mktemp("bad_csv")
    rng = np.random.default_rng(3)
    for k, (line, cells) in enumerate(((12, "0.1,0.2,x7,0.4,1"), (20, "0.1,0.2,0.3,1"))):
        rows = ["a,b,c,d,y"] + [",".join(f"{v:.4f}" for v in r) + f",{int(r[0] > 0.5)}" for r in rng.random((30, 4))]
        rows[line - 1] = cells
        (root / f"part-{k}.csv").write_text("\n".join(rows) + "\n")
    return root


def test_a_bad_csv_row_mid_run_is_one_line_naming_file_and_line(bad_csv):
    s = chain.compose(
        [
            *CSV,
            f"data.path={bad_csv}/*.csv",
            "data.shuffle=false",
            "data.batch_size=8",
            "trainer.steps=7",
            "trainer.steps_per_call=1",
        ]
    )
    with pytest.raises(ConfigError) as e:
        chain.build(s).fit()
    assert e.value.exit_code == 2
    text = str(e.value)
    assert "\n" not in text and text.startswith(
        f"data.path: line 12 of {bad_csv}/part-0.csv: column 'c' holds 'x7', not a finite number "
        "(data.on_bad_record=skip leaves such rows out); "
    ), text


def test_a_csv_row_with_too_few_fields_or_a_label_out_of_range_names_its_line_or_is_counted(bad_csv, tmp_path):
    from chain.data.sources.csv import csv_stream
    from chain.data.sources.csv.csv_data import shards as csv_shards

    (tmp_path / "label.csv").write_text("a,b,c,d,y\n" + "0.1,0.2,0.3,0.4,1\n" * 5 + "0.1,0.2,0.3,0.4,2\n")
    lines = []
    for path in (f"{bad_csv}/part-1.csv", f"{tmp_path}/label.csv"):
        files = csv_shards(chain.compose([*CSV, f"data.path={path}", "data.batch_size=4"]).data)
        with pytest.raises(tf.errors.InvalidArgumentError) as e:
            for _ in iter(csv_stream.training(files, 4, False, 0)):
                pass
        lines.append(csv_stream.bad_record(e.value, files))
    assert lines == [
        f"data.path: line 20 of {bad_csv}/part-1.csv: it has 4 fields, the header has 5 "
        "(data.on_bad_record=skip leaves such rows out)",
        f"data.path: line 7 of {tmp_path}/label.csv: column 'y' holds 2, not a class label 0..1 "
        "(data.classes.label=2) (data.on_bad_record=skip leaves such rows out)",
    ]
    # data.on_bad_record=skip: the two bad rows of bad_csv left out and counted, an epoch of the other 58
    files = csv_shards(chain.compose([*CSV, f"data.path={bad_csv}/*.csv", "data.on_bad_record=skip"]).data)
    skipped = csv_stream.skip_counter(files)
    stream = iter(csv_stream.training(files, 29, True, 0, skipped))
    rows = np.concatenate([next(stream)[0].numpy() for _ in range(2)])
    # the count is of rows read, read-ahead (the next epoch's) included
    assert int(skipped.numpy()) >= 2 and len(np.unique(rows, axis=0)) == 58 and (rows[:, 2] != 0).all()


def test_a_regular_csv_chunk_reads_as_a_checked_one_and_an_overflow_is_named(tmp_path):
    from chain.data.sources.csv import csv_stream
    from chain.data.sources.csv.csv_data import shards as csv_shards

    rows = ["a,b,c,d,y", " 0.5 ,+1,.25,1e-3,1\r", "1.,2,3,-4e2,0"]
    (tmp_path / "regular.csv").write_text("\n".join(rows) + "\n")  # every line a row of numbers: the quick parse
    (tmp_path / "blank.csv").write_text("\n".join([*rows[:2], "", rows[2]]) + "\n")  # not: each cell checked
    (tmp_path / "overflow.csv").write_text("a,b,c,d,y\n0,1e999,0,0,1\n")  # a number, but not a finite one

    def read(name):
        files = csv_shards(chain.compose([*CSV, f"data.path={tmp_path}/{name}.csv", "data.batch_size=2"]).data)
        x, ys = next(iter(csv_stream.training(files, 2, False, 0)))
        return x.numpy(), ys["label"].numpy()

    (x, y), (x_checked, y_checked) = read("regular"), read("blank")
    assert np.array_equal(x, np.float32([[0.5, 1, 0.25, 1e-3], [1, 2, 3, -400]])) and list(y) == [1, 0]
    assert np.array_equal(x, x_checked) and np.array_equal(y, y_checked)
    files = csv_shards(chain.compose([*CSV, f"data.path={tmp_path}/overflow.csv", "data.batch_size=1"]).data)
    with pytest.raises(tf.errors.InvalidArgumentError) as e:
        next(iter(csv_stream.training(files, 1, False, 0)))
    assert csv_stream.bad_record(e.value, files) == (
        f"data.path: line 2 of {tmp_path}/overflow.csv: column 'b' holds '1e999', not a finite number "
        "(data.on_bad_record=skip leaves such rows out)"
    )


@pytest.fixture(scope="module")
def npz_file(tmp_path_factory):
    root = tmp_path_factory.mktemp("npz")
    x = np.random.default_rng(5).random((200, 6), dtype=np.float32)
    np.savez(root / "a.npz", x=x, y=(x[:, 0] > 0.5).astype("int64"), v=x.sum(1))
    np.savez_compressed(root / "c.npz", x=x, y=(x[:, 0] > 0.5).astype("int64"))
    return root, x


NPZ = [
    "+stages=2",
    "model.width=8",
    "model.depth=1",
    "trainer.progress=false",
    "data=npz",
    "data.stream=true",
    "data.batch_size=16",
    "data.shuffle_buffer=24",
]


def test_an_npz_stream_trains_reads_every_example_once_an_epoch_and_resumes_exact(npz_file, tmp_path):
    from chain.data.sources.npz import npz_stream
    from chain.data.sources.npz.npz_data import shards as npz_shards

    root, x = npz_file
    s = chain.compose(
        [*NPZ, f"data.path={root}/a.npz", "data.targets={label: y, v: v}", "data.classes={label: 2}", "trainer.steps=2"]
    )
    summary = chain.build(s).fit()
    assert (summary["train_examples"], summary["val_examples"]) == (180, 20)  # the last 20 rows held out
    assert np.isfinite(summary["loss_last"])
    files = npz_shards(s.data)
    stream = iter(npz_stream.training(files, 20, True, 7))  # 180 rows: 9 batches an epoch
    epoch = [next(stream) for _ in range(9)]
    seen = np.concatenate([b[0].numpy() for b in epoch])
    assert not np.array_equal(seen, x[:180])  # shuffled ...
    assert np.array_equal(seen[np.lexsort(seen.T[::-1])], x[:180][np.lexsort(x[:180].T[::-1])])  # ... each row once
    labels = np.concatenate([b[1]["label"].numpy() for b in epoch])
    assert np.array_equal(labels, (seen[:, 0] > 0.5).astype("int32"))  # the targets read with their inputs
    assert np.allclose(np.concatenate([b[1]["v"].numpy() for b in epoch]), seen.sum(1))
    _resumes_exact(stream, tmp_path)
    val = np.concatenate([b[0].numpy() for b in npz_stream.validation(files, 16)])
    assert np.array_equal(val, x[180:])


def test_a_stream_saved_as_another_version_built_it_is_refused_in_one_line(npz_file, tmp_path, monkeypatch):
    from chain.data import chunks
    from chain.errors import CheckpointError

    root, _ = npz_file
    args = [*NPZ, f"data.path={root}/a.npz", "data.y=y", "data.classes={label: 2}", "checkpoint.every=2"]
    chain.build(chain.compose([*args, "trainer.steps=2"]), run_dir=str(tmp_path)).fit()
    batched = chunks.batched  # what another version of chain might build from the same settings (as the
    monkeypatch.setattr(
        "chain.data.chunks.batched",  # stream before chunks did): examples one at a time
        lambda examples, *a: batched(examples.unbatch().batch(64), *a),
    )
    with pytest.raises(
        CheckpointError,
        match=r"^data/ckpt-2 holds the position of another input stream than this "
        r"run builds: .*another version of chain reads them differently\); resume with the version",
    ):
        chain.build(chain.compose([*args, "trainer.steps=4", "resume=true"]), run_dir=str(tmp_path)).fit()


def test_a_compressed_npz_cannot_stream_one_line(npz_file):
    root, _ = npz_file
    with pytest.raises(
        ConfigError,
        match=r"^data\.path='.*c\.npz' is compressed \(np\.savez_compressed\): "
        r"data\.stream=true reads its arrays in place, .*save it with np\.savez",
    ):
        chain.prepared.check_config(
            chain.compose([*NPZ, f"data.path={root}/c.npz", "data.y=y", "data.classes={label: 2}"])
        )


def test_an_npz_stream_holds_its_buffers_not_its_array(tmp_path):
    from chain.data.sources.npz import npz_stream
    from chain.data.sources.npz.npz_data import shards as npz_shards

    def read(path):
        files = npz_shards(
            chain.compose(
                [*NPZ, f"data.path={path}", "data.y=y", "data.classes={label: 2}", "data.shuffle_buffer=64"]
            ).data
        )
        stream = iter(npz_stream.training(files, 64, True, 0))

        def epoch():
            for _ in range(files.examples // 64):
                next(stream)  # each batch dropped once read, as a training step drops it

        return epoch

    for name, n in (("small", 2048), ("big", 16384)):  # 8 MB in 32 blocks: every buffer of the stream used once
        np.savez(tmp_path / f"{name}.npz", x=np.ones((n, 1024), np.float32), y=np.zeros(n, np.int64))
    peak_rss_growth(read(tmp_path / "small.npz"))  # TensorFlow's one-time costs paid first (about 8 MB)
    _, grew = peak_rss_growth(read(tmp_path / "big.npz"))
    size = os.path.getsize(tmp_path / "big.npz")  # 64 MB
    # the stream's buffers: about 4.5 MB measured (loading the file would add its 64 MB)
    assert grew < size / 4, f"resident memory rose {grew / 2**20:.0f} MB over an epoch of {size / 2**20:.0f} MB"


CALL = [
    "+stages=2",
    "model.width=8",
    "model.depth=1",
    "trainer.progress=false",
    "data=callable",
    "data.stream=true",
    "data.batch_size=8",
    "data.shuffle_buffer=16",
]


def test_a_callable_stream_trains_on_the_dataset_as_it_is(tmp_path):
    from chain.data.sources.function import function_stream
    from chain.data.sources.function.callable_data import shards as callable_shards

    s = chain.compose(
        [
            *CALL,
            "data._target_=user_datasets.make_dataset",
            "+data.several=true",
            "data.classes={cls: 2}",
            "trainer.steps=2",
        ]
    )
    summary = chain.build(s).fit()
    # 48 examples (its cardinality), the first 5 held out for validation
    assert (summary["train_examples"], summary["val_examples"], summary["steps"]) == (43, 5, 2)
    assert np.isfinite(summary["loss_last"])
    data = callable_shards(s.data)
    stream = iter(function_stream.training(data, 8, True, 0))
    next(stream)
    _resumes_exact(stream, tmp_path)


@pytest.mark.parametrize(
    "target, more, message",
    [
        ("endless", [], "data._target_=user_datasets.endless returned a dataset that cannot be saved in a checkpoint "),
        ("make_dataset", ["data.classes=null"], "data.classes.label is needed with data.stream=true"),
    ],
)
def test_a_callable_stream_needs_a_checkpointable_dataset_and_its_classes(target, more, message):
    from chain.data.sources.function.callable_data import shards as callable_shards

    with pytest.raises(ConfigError, match="^" + message.replace(".", r"\.")):
        callable_shards(
            chain.compose([*CALL, f"data._target_=user_datasets.{target}", "data.classes={label: 2}", *more]).data
        )


def test_a_count_found_in_memory_says_what_was_counted_and_when(tmp_path, caplog):
    """The command line counts while it checks the config, before the run's log is open; the run's
    log then says what that pass counted (the total) and when, not only that it happened."""
    import time

    from chain.data import count_cache

    paths = []
    for k, rows in enumerate((3, 5)):
        paths.append(str(tmp_path / f"part-{k}.csv"))
        with open(paths[-1], "w") as f:
            f.write("x\n" * rows)
    rows_of = lambda p: sum(1 for _ in open(p))  # noqa: E731
    count_cache.forget()
    before = time.strftime("%H:%M:%S")
    with caplog.at_level("INFO", logger="chain"):
        assert count_cache.counts(paths, "data.path='*.csv'", "csv rows", rows_of) == (3, 5)  # not logged by the CLI
        caplog.clear()
        assert count_cache.counts(paths, "data.path='*.csv'", "csv rows", rows_of) == (3, 5)  # the run's log
    (line,) = [r.getMessage() for r in caplog.records]
    assert line.startswith("csv rows of 2 file(s) of data.path='*.csv': 8 in all, counted by a pass over them at ")
    at = line.split(" at ", 1)[1][:8]
    assert before <= at <= time.strftime("%H:%M:%S") and "earlier in this process" in line
    count_cache.forget()
