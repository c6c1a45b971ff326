"""A stream's files are part of its identity (`chain.data.identity`): every checkpoint of a streamed run
records each file's size, modification time and digest, and a resume over files that changed (a
TFRecord shard rewritten with the same size, rows appended to a CSV file, an `.npz` replaced by one of
the same shapes, a shard added or removed) is one line naming the file and what changed, before
anything is restored; `checkpoint.accept_changed_files=true` trains on them, the stream restarted,
and says from which step. A resume over unchanged files stays bit-exact (tests/test_streaming.py)."""

from __future__ import annotations

import json
import os
import shutil

import numpy as np
import pytest
import tensorflow as tf

import chain
from chain.data import identity
from chain.errors import ConfigError
from chain.records.serial import from_json
from chain.records.stream_files import StreamFiles
from conftest import manifest, run_cli
from test_streaming import CSV, NPZ, TINY, write_csv, write_shards

TFRECORD = [
    *TINY,
    "data.features={x: 'float32[8]', y: int64}",
    "data.batch_size=16",
    "data.shuffle_buffer=24",
    "data.path=s/*.tfrecord",
]
CSV_GLOB = [*CSV, "data.path=c/*.csv"]
NPZ_FILE = [*NPZ, "data.path=a.npz", "data.y=y", "data.classes={label: 2}"]
RUN = ["checkpoint.every=2", "checkpoint.export=false"]


def _trained(root, args: list[str]) -> None:
    """A run of 2 steps over `args`' stream (its files named relative to `root`) in `root/run`, its
    checkpoint at step 2. Each test resumes a copy of `root` from inside it (the files keep their
    names and modification times), so one run serves every case of a kind."""
    here = os.getcwd()
    os.chdir(root)
    try:
        chain.build(chain.compose([*args, *RUN, "trainer.steps=2"]), run_dir=str(root / "run")).fit()
    finally:
        os.chdir(here)


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """kind -> a directory holding its files and a run of 2 steps over them (`_trained`)."""
    made = {}

    def make(kind: str):
        if kind not in made:
            root = tmp_path_factory.mktemp(kind)
            if kind == "tfrecord":
                write_shards(root / "s", shards=4, per=40, width=8)
            elif kind == "csv":
                write_csv(root / "c", files=3, rows=40)
            else:
                x = np.random.default_rng(5).random((200, 6), dtype=np.float32)
                np.savez(root / "a.npz", x=x, y=(x[:, 0] > 0.5).astype("int64"))
            _trained(root, {"tfrecord": TFRECORD, "csv": CSV_GLOB, "npz": NPZ_FILE}[kind])
            made[kind] = root
        return made[kind]

    return make


@pytest.fixture
def copy_of(trained, tmp_path, monkeypatch):
    """A copy of `trained(kind)`, the current directory."""

    def copy(kind: str):
        shutil.copytree(trained(kind), tmp_path / kind)  # copy2: modification times kept
        monkeypatch.chdir(tmp_path / kind)
        return tmp_path / kind

    return copy


def _refused(args: list[str]) -> str:
    """A resume of `run` is one ConfigError line, and the run directory's checkpoint is as it was."""
    before = open("run/checkpoint.json").read()
    with pytest.raises(ConfigError) as e:
        chain.build(chain.compose([*args, *RUN, "trainer.steps=4", "resume=true"]), run_dir="run").fit()
    assert "\n" not in str(e.value)
    assert open("run/checkpoint.json").read() == before
    return str(e.value)


SINCE = " since the checkpoint of step 2 recorded the stream's files"


def test_a_tfrecord_shard_rewritten_with_other_values_and_the_same_size_is_refused(copy_of):
    root = copy_of("tfrecord")
    write_shards(root / "other", shards=1, per=40, width=8, seed=9)  # 40 records of other values
    shard, other = root / "s" / "part-000.tfrecord", root / "other" / "part-000.tfrecord"
    size, mtime = os.path.getsize(shard), os.stat(shard).st_mtime_ns
    assert os.path.getsize(other) == size and other.read_bytes() != shard.read_bytes()
    shutil.copyfile(other, shard)
    os.utime(shard, ns=(mtime, mtime))  # even with its modification time put back: its bytes differ
    assert _refused(TFRECORD) == (
        f"data.path: s/part-000.tfrecord was rewritten (the same {size} bytes, other contents){SINCE}: a stream "
        "resumes only over the files it was reading; put them back, or resume with checkpoint.accept_changed_files="
        "true to train on them as they are now (the stream then restarts)"
    )


def _rows(path, n: int) -> list[str]:
    """The first `n` rows of a CSV file written by `write_csv` (its header and blank line left out)."""
    return [line for line in path.read_text().splitlines(keepends=True)[1:] if line.strip()][:n]


def test_rows_appended_to_a_csv_file_are_refused_naming_its_sizes(copy_of):
    root = copy_of("csv")
    path = root / "c" / "part-1.csv"
    size = os.path.getsize(path)
    with open(path, "a") as f:
        f.writelines(_rows(root / "c" / "part-0.csv", 40))
    assert _refused(CSV_GLOB).startswith(
        f"data.path: c/part-1.csv was resized ({size} -> {os.path.getsize(path)} bytes){SINCE}: "
    )


def test_an_npz_replaced_by_another_of_the_same_shapes_is_refused(copy_of):
    root = copy_of("npz")
    path = root / "a.npz"
    size = os.path.getsize(path)
    with np.load(path) as z:
        x, y = z["x"][::-1].copy(), z["y"][::-1].copy()  # the same rows in another order
    np.savez(path, x=x, y=y)
    assert os.path.getsize(path) == size
    assert _refused(NPZ_FILE).startswith(
        f"data.path: a.npz was rewritten (the same {size} bytes, other contents){SINCE}: "
    )


def test_a_shard_added_before_a_resume_is_refused_naming_it_first(copy_of):
    root = copy_of("tfrecord")
    write_shards(root / "five", shards=5, per=40, width=8)
    shutil.copyfile(root / "five" / "part-004.tfrecord", root / "s" / "part-004.tfrecord")
    # the added file is now the one held out for validation (the last), and part-003 is read for training
    assert _refused(TFRECORD).startswith(f"data.path: s/part-004.tfrecord was added{SINCE} (and 1 more file changed): ")


def test_a_shard_removed_before_a_resume_is_one_line_naming_it_and_no_tensorflow_warning(copy_of):
    root = copy_of("tfrecord")
    before = {d: sorted(os.listdir(root / "run" / d)) for d in ("data", "stage_00", "stage_01")}
    saved = manifest(root / "run")
    os.remove(root / "s" / "part-001.tfrecord")
    r = run_cli(root, *TFRECORD, *RUN, "trainer.steps=4", "resume=true", "hydra.run.dir=run")
    assert r.returncode == 2, r.stderr
    errors = [line for line in r.stderr.splitlines() if line.startswith("error:")]
    assert errors == [
        f"error: data.path: s/part-001.tfrecord was removed{SINCE}: a stream resumes only over the "
        "files it was reading; put them back, or resume with checkpoint.accept_changed_files=true to "
        "train on them as they are now (the stream then restarts)"
    ], r.stderr
    assert "save_counter" not in r.stderr and "WARNING" not in r.stderr, r.stderr
    assert manifest(root / "run") == saved
    assert {d: sorted(os.listdir(root / "run" / d)) for d in before} == before


def test_accepting_changed_files_trains_says_from_which_step_and_records_them(copy_of, caplog):
    root = copy_of("csv")
    path = root / "c" / "part-2.csv"
    size = os.path.getsize(path)
    with open(path, "a") as f:  # appended data for a new epoch
        f.writelines(_rows(path, 40))
    with caplog.at_level("INFO", logger="chain"):
        summary = chain.build(
            chain.compose([*CSV_GLOB, *RUN, "trainer.steps=4", "resume=true", "checkpoint.accept_changed_files=true"]),
            run_dir="run",
        ).fit()
    assert summary["resumed_from"] == 2 and summary["steps"] == 4 and np.isfinite(summary["loss_last"])
    assert summary["train_examples"] == 160  # the appended rows counted: 3 files of 40 rows, and 40 more
    notes = [r.getMessage() for r in caplog.records if "accept_changed_files" in r.getMessage()]
    assert notes == [
        f"note: checkpoint.accept_changed_files=true: data.path: c/part-2.csv was resized ({size} -> "
        f"{os.path.getsize(path)} bytes) since step 2; the stream restarts at step 3 with the first batch "
        "of a new stream over the files as they are now (the position saved at step 2 and the batches it "
        "had read ahead are dropped)"
    ]
    # the checkpoints since record the files as they are now, so the next resume needs no override
    record = json.loads(
        tf.train.load_checkpoint("run/data/ckpt-4").get_tensor("record/.ATTRIBUTES/VARIABLE_VALUE").decode()
    )
    now = [identity.stamp(f"c/part-{k}.csv", "data.path", identity.TRAIN) for k in range(3)]
    assert identity.changes(from_json(StreamFiles, record), StreamFiles(now)) == []
    assert {f["path"]: f["size"] for f in record["files"]}["c/part-2.csv"] == os.path.getsize(path)


def test_a_large_file_is_digested_from_blocks_and_a_change_between_them_shows_as_modified(tmp_path):
    path = tmp_path / "big.bin"
    data = bytearray(np.random.default_rng(0).bytes(1 << 20))
    path.write_bytes(bytes(data))
    saved = identity.stamp(str(path), "data.path", identity.TRAIN)
    assert saved.digest.startswith(f"{identity.BLOCKS}x{identity.BLOCK}:")
    data[identity.BLOCK + 100] ^= 1  # a byte no block covers: the first is its first 4 KiB, the second at 68 KiB
    path.write_bytes(bytes(data))
    os.utime(path, ns=(saved.mtime_ns + 10**9, saved.mtime_ns + 10**9))
    (change,) = identity.changes(
        StreamFiles([saved]), StreamFiles([identity.stamp(str(path), "data.path", identity.TRAIN)])
    )
    assert (change.what, change.detail.split(" (")[0]) == ("rewritten", "was modified")
    data[0] ^= 1  # a byte of the first block: the digest differs
    path.write_bytes(bytes(data))
    (change,) = identity.changes(
        StreamFiles([saved]), StreamFiles([identity.stamp(str(path), "data.path", identity.TRAIN)])
    )
    assert change.detail == f"was rewritten (the same {len(data)} bytes, other contents)"
    # a small file is digested whole: touched alone, it is unchanged
    small = tmp_path / "small.bin"
    small.write_bytes(b"x" * 1000)
    first = identity.stamp(str(small), "data.path", identity.TRAIN)
    os.utime(small, ns=(first.mtime_ns + 10**9, first.mtime_ns + 10**9))
    assert first.digest.startswith("whole:")
    assert (
        identity.changes(StreamFiles([first]), StreamFiles([identity.stamp(str(small), "data.path", identity.TRAIN)]))
        == []
    )


def test_a_tokenizers_stream_is_its_texts_and_vocabulary_not_the_cache_of_its_ids(tmp_path, monkeypatch):
    """`data=text data.tokenizer`: the stamps are the texts' and the vocabulary's, so ids made again in
    another cache folder change nothing, while an edited vocabulary (or text) is still a change."""
    from chain.data import loader

    pytest.importorskip("keras_hub")
    (tmp_path / "vocab.txt").write_text("[PAD]\n[UNK]\nthe\ncat\nsat\n.\n")
    (tmp_path / "a.txt").write_text("the cat sat.\n" * 20)
    monkeypatch.chdir(tmp_path)
    data = chain.compose(
        ["mode=e2e", "data=text", "data.path=a.txt", "data.tokenizer=vocab.txt", "data.seq_len=4"]
    ).data

    def now(cache: str) -> StreamFiles:
        monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / cache))
        return identity.stamps(loader.load(data, 0).shards)

    first = now("cache")
    assert [(f.path, f.key, f.role) for f in first.files] == [
        ("a.txt", "data.path", "train"),
        ("vocab.txt", "data.tokenizer", "vocabulary"),
    ]
    shutil.rmtree(tmp_path / "cache")
    assert identity.changes(first, now("other_cache")) == []
    (tmp_path / "vocab.txt").write_text("[PAD]\n[UNK]\nthe\ndog\nsat\n.\n")  # other ids, the same size
    with open("a.txt", "a") as f:
        f.write("the cat.\n")
    assert [c.line() for c in identity.changes(first, now("other_cache"))] == [
        "data.path: a.txt was resized (260 -> 269 bytes)",
        "data.tokenizer: vocab.txt was rewritten (the same 26 bytes, other contents)",
    ]
