"""Damaged or ambiguous data files, refused in one line naming the file and the place in it
(exit 2, no run directory left), never a traceback and never trained on silently: `.npz` files
with a bad CRC, a bad magic number or a broken deflate stream (real files from
`np.savez_compressed`, then damaged), a CSV not in UTF-8, with a repeated or blank column name or
a `nan` cell, a truncated TFRecord file, integer labels that are all negative, non-finite inputs,
a data function whose dataset never ends, and an empty or truncated `.keras` file."""

from __future__ import annotations

import os
import re
import time
import zipfile

import numpy as np
import pytest
import tensorflow as tf

import chain
from chain.data import describe, load
from conftest import run_cli, run_dirs

N = 40
TESTS = os.path.dirname(os.path.abspath(__file__))


def _npz_damaged(path, how: str) -> None:
    """A valid compressed `.npz`, then one kind of real damage to its first member (x.npy)."""
    rng = np.random.default_rng(0)
    np.savez_compressed(path, x=rng.random((N, 3)).astype("float32"), y=np.arange(N) % 2)
    b = bytearray(path.read_bytes())
    with zipfile.ZipFile(path) as z:
        info = z.getinfo("x.npy")
    local = info.header_offset
    if how == "magic":  # the member's local header signature PK\3\4
        b[local + 3] ^= 0xFF
    elif how == "crc":  # the CRC-32 the reader checks the data against (local and central headers)
        central = b.index(b"PK\x01\x02")
        for at in (local + 14, central + 16):
            b[at] ^= 0xFF
    elif how == "deflate":  # the first deflate block header: block type 3, which does not exist
        name_len, extra_len = (int.from_bytes(b[at : at + 2], "little") for at in (local + 26, local + 28))
        b[local + 30 + name_len + extra_len] = 0xFF
    path.write_bytes(bytes(b))


def _records(path, n: int) -> int:
    """`n` TFRecord examples of 3 floats and a label; returns one record's size on disk."""
    with tf.io.TFRecordWriter(str(path)) as w:
        for i in range(n):
            feature = {
                "x": tf.train.Feature(float_list=tf.train.FloatList(value=[i / n] * 3)),
                "y": tf.train.Feature(int64_list=tf.train.Int64List(value=[i % 2])),
            }
            w.write(tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString())
    return os.path.getsize(path) // n


def _keras_file(path) -> None:
    import keras

    keras.Sequential([keras.Input((64,)), keras.layers.Dense(4), keras.layers.Dense(10)]).save(str(path))


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    root = tmp_path_factory.mktemp("damaged")
    for how in ("magic", "crc", "deflate"):
        _npz_damaged(root / f"{how}.npz", how)
    rows = "\n".join(f"{i / N:.3f},{(i * 7 % N) / N:.3f},{i % 2}" for i in range(N))
    (root / "latin1.csv").write_bytes("f1,température,label\n".encode("latin-1") + rows.encode())
    (root / "twice.csv").write_text("f1,f1,label\n" + rows + "\n")
    (root / "blank.csv").write_text("f1,,label\n" + rows + "\n")
    (root / "nan.csv").write_text("f1,f2,label\n0.1,0.2,1\nnan,0.4,0\n" + rows + "\n")
    (root / "bom.csv").write_text("f1,f2,label\n" + rows + "\n", encoding="utf-8-sig")
    rng = np.random.default_rng(1)
    x = rng.random((N, 3)).astype("float32")
    np.savez(root / "negative.npz", x=x, y=-1 - np.arange(N) % 3)
    x_nan = x.copy()
    x_nan[7, 1] = np.nan
    np.savez(root / "nonfinite.npz", x=x_nan, y=np.arange(N) % 2)
    size = _records(root / "cut.tfrecord", 300)
    whole = (root / "cut.tfrecord").read_bytes()
    # Inside record 180 (0-based), 180 whole records before it: in its 12-byte header (where
    # TensorFlow stops without a word), and in its data (where TensorFlow says "truncated record").
    (root / "cut.tfrecord").write_bytes(whole[: 180 * size + 7])
    (root / "cut-data.tfrecord").write_bytes(whole[: 180 * size + size // 2])
    (root / "empty_val").mkdir()  # a stream of 3 files, the last (held out for validation) empty: issue 39's crash
    for k in range(2):
        _records(root / "empty_val" / f"part-{k}.tfrecord", 40)
    (root / "empty_val" / "part-2.tfrecord").write_bytes(b"")
    (root / "narrow").mkdir()  # the second file's examples hold 2 floats, not 3
    _records(root / "narrow" / "part-0.tfrecord", 40)
    with tf.io.TFRecordWriter(str(root / "narrow" / "part-1.tfrecord")) as w:
        w.write(
            tf.train.Example(
                features=tf.train.Features(
                    feature={
                        "x": tf.train.Feature(float_list=tf.train.FloatList(value=[0.5, 0.5])),
                        "y": tf.train.Feature(int64_list=tf.train.Int64List(value=[1])),
                    }
                )
            ).SerializeToString()
        )
    (root / "empty.keras").write_bytes(b"")
    _keras_file(root / "whole.keras")
    whole = (root / "whole.keras").read_bytes()
    (root / "cut.keras").write_bytes(whole[: len(whole) // 2])
    return str(root)


SHORT = ["data.batch_size=8", "trainer.steps=2", "trainer.progress=false"]
SMALL = ["model.width=8", "model.depth=1", *SHORT]
NPZ = ["data=npz", "data.y=y"]
CSV = ["data=csv", "data.y=label"]
CALL = ["data=callable"]
PATH = "data.path={root}/"

# case: (overrides, the file the line names, what the line says after it)
CASES = {
    "npz bad magic": (
        [*NPZ, PATH + "magic.npz"],
        "magic.npz",
        r"' is damaged \(x\.npy: Bad magic number for file header\); write it again$",
    ),
    "npz bad crc": ([*NPZ, PATH + "crc.npz"], "crc.npz", r"' is damaged \(x\.npy: Bad CRC-32 for file 'x\.npy'\)"),
    "npz broken deflate": (
        [*NPZ, PATH + "deflate.npz"],
        "deflate.npz",
        r"' is damaged \(x\.npy: Error -3 while decompressing data: invalid block type\)",
    ),
    "csv not utf-8": (
        [*CSV, PATH + "latin1.csv"],
        "latin1.csv",
        r"' is not UTF-8 text: line 1 holds the byte 0xe9 at column 8; save it as UTF-8$",
    ),
    "csv column twice": (
        [*CSV, PATH + "twice.csv"],
        "twice.csv",
        r"': columns 1 and 2 of the header are both called 'f1'; give every column its own name$",
    ),
    "csv blank column name": (
        [*CSV, PATH + "blank.csv"],
        "blank.csv",
        r"': column 2 of the header has no name; give every column its own name$",
    ),
    "csv nan cell": ([*CSV, PATH + "nan.csv"], "nan.csv", r"': line 3, column 'f1' holds 'nan', not a finite number$"),
    "negative integer labels": (
        [*NPZ, PATH + "negative.npz"],
        "negative.npz",
        r"^error: data.y='y' of .* holds integer labels that are all negative \(-3\.\.-1\): "
        r"class labels are 0\.\.C-1; data.classes=\{label: 0\} learns them as a real value$",
    ),
    "non-finite inputs": (
        [*NPZ, PATH + "nonfinite.npz"],
        "nonfinite.npz",
        r"^error: data.x='x' of .*nonfinite.npz holds nan in example 7; inputs must be finite$",
    ),
    "truncated tfrecord": (
        ["data=tfrecord", "data.path={root}/cut.tfrecord", "data.y=y", "data.features={x: 'float32[3]', y: int64}"],
        "cut.tfrecord",
        r"\.tfrecord ends inside record 180 \(180 whole records before it\): the file is cut "
        r"short, or that record's length is damaged$",
    ),
    "truncated tfrecord data": (
        [
            "data=tfrecord",
            "data.path={root}/cut-data.tfrecord",
            "data.y=y",
            "data.features={x: 'float32[3]', y: int64}",
        ],
        "cut-data.tfrecord",
        r"\.tfrecord ends inside record 180 \(180 whole records before it\)",
    ),
    "empty validation shard": (
        [
            "data=tfrecord",
            "data.path={root}/empty_val/*.tfrecord",
            "data.y=y",
            "data.stream=true",
            "data.classes={label: 2}",
            "data.val_fraction=0.3",
            "data.features={x: 'float32[3]', y: int64}",
        ],
        "empty_val/part-2.tfrecord",
        r"^error: data.path: .* holds no records, and it is held out for validation \(the last 1 "
        r"file\(s\) of data.path in sorted order\); every file streamed holds at least one: "
        r"remove it, or change data.path$",
    ),
    "tfrecord file of another shape": (
        [
            "data=tfrecord",
            "data.path={root}/narrow/*.tfrecord",
            "data.y=y",
            "data.features={x: 'float32[3]', y: int64}",
        ],
        "narrow/part-1.tfrecord",
        r"^error: data.path: record 0 of .* is not as data.features declares it: "
        r"feature x holds 2 values, declared float32\[3\] \(each file.s first record "
        r"is checked before training\)$",
    ),
    "endless generator": (
        [*CALL, "data._target_=user_datasets.endless", "data.max_examples=50"],
        None,
        r"^error: data._target_=user_datasets.endless gave more than data.max_examples=50 examples "
        r"\(an endless dataset\?\); return each example once, or raise data.max_examples$",
    ),
    "a filter that drops everything": (
        [*CALL, "data._target_=user_datasets.nothing_passes", "data.read_timeout_s=3"],
        None,
        r"^error: data._target_=user_datasets.nothing_passes gave no example for 3 s "
        r"\(data.read_timeout_s\) after 0 examples: an endless dataset that yields "
        r"nothing\?",
    ),
    "empty keras file": (
        ["model=keras", "model.path={root}/empty.keras"],
        "empty.keras",
        r"^error: model.path='.*empty.keras' is empty: it is not a Keras model file$",
    ),
    "truncated keras file": (
        ["model=keras", "model.path={root}/cut.keras"],
        "cut.keras",
        r"^error: model.path='.*cut.keras' is damaged \(not a whole \.keras zip file: ",
    ),
}


@pytest.mark.parametrize("case", CASES)
def test_damaged_data_is_one_line_naming_the_file_and_nothing_is_left(root, case, tmp_path):
    overrides, name, message = CASES[case]
    env = {"PYTHONPATH": os.pathsep.join([TESTS, os.environ.get("PYTHONPATH", "")])}
    start = time.monotonic()
    small = SHORT if overrides[0] == "model=keras" else SMALL
    r = run_cli(tmp_path, *small, *[o.replace("{root}", root) for o in overrides], env=env, timeout=120)
    lines = [line for line in r.stderr.splitlines() if line.strip()]
    assert r.returncode == 2, r.stderr
    assert len(lines) == 1 and lines[0].startswith("error: "), r.stderr
    if name is not None:
        assert os.path.join(root, name) in lines[0]
    assert re.search(message, lines[0]), lines[0]
    assert run_dirs(tmp_path) == [] and not os.path.exists(tmp_path / "outputs")
    if case == "a filter that drops everything":
        assert time.monotonic() - start < 60  # the limit, not a hang


def test_a_csv_header_with_a_byte_order_mark_names_its_first_column_plainly(root):
    s = chain.compose([*SMALL, *CSV, f"data.path={root}/bom.csv", "data.x=[f1,f2]"])
    assert describe(s.data).input_shape == (2,)
    ds = load(s.data, 0)
    table = np.loadtxt(os.path.join(root, "bom.csv"), delimiter=",", skiprows=1, dtype=np.float64)
    np.testing.assert_array_equal(
        np.sort(np.concatenate([ds.x[:, 0], ds.val_x[:, 0]])), np.sort(table[:, 0].astype(np.float32))
    )


def test_limits_on_reading_a_function_are_validated():
    for bad, message in (
        ("data.max_examples=0", r"^data.max_examples=0 must be >= 1"),
        ("data.read_timeout_s=0", r"^data.read_timeout_s=0 must be > 0"),
    ):
        with pytest.raises(chain.ConfigError, match=message):
            chain.compose([*CALL, "data._target_=user_datasets.make_dataset", bad])


def test_negative_integer_labels_learn_as_a_real_value_when_told(root):
    s = chain.compose([*SMALL, *NPZ, f"data.path={root}/negative.npz", "data.classes={label: 0}", "loss=mse"])
    assert [(t.name, t.classes) for t in describe(s.data).targets] == [("label", 0)]
    ds = load(s.data, 0)
    assert ds.y["label"].dtype == np.float32 and ds.y["label"].max() == -1


def test_a_damaged_checksum_mid_stream_names_the_file_and_the_record(tmp_path):
    """TensorFlow's reader says only `corrupted record at N` (a byte offset), and a compiled loop's error
    starts `Graph execution error:`: the line names the file and the record all the same."""
    (tmp_path / "data").mkdir()
    size = [_records(tmp_path / "data" / f"part-{k}.tfrecord", 40) for k in range(2)][0]
    damaged = bytearray((tmp_path / "data" / "part-1.tfrecord").read_bytes())
    damaged[25 * size + 20] ^= 0xFF  # in record 25's data
    (tmp_path / "data" / "part-1.tfrecord").write_bytes(bytes(damaged))
    r = run_cli(
        tmp_path,
        *SMALL,
        "data=tfrecord",
        f"data.path={tmp_path}/data/*.tfrecord",
        "data.y=y",
        "data.stream=true",
        "data.classes={label: 2}",
        "data.val_fraction=0",
        "data.shuffle=false",
        "data.features={x: 'float32[3]', y: int64}",
        "trainer.steps=8",
        timeout=120,
    )
    lines = [line for line in r.stderr.splitlines() if line.strip()]
    assert r.returncode == 2 and len(lines) == 1, r.stderr
    assert lines[0] == (
        f"error: data.path: record 25 of {tmp_path}/data/part-1.tfrecord is damaged: its checksum fails "
        f"(TensorFlow: corrupted record at byte {25 * size + 12}); write the file again, or leave it "
        "out (data.on_bad_record=skip does not leave out a damaged record); no checkpoint had been saved"
    )


def test_records_read_without_tensorflow_agree_with_its_reader(tmp_path):
    from chain.data.sources.tfrecord import tfrecord_files

    size = _records(tmp_path / "a.tfrecord", 5)
    whole = (tmp_path / "a.tfrecord").read_bytes()
    for at, name in ((3 * size + 2, "length"), (3 * size + 30, "data")):  # record 3's length, then its data
        damaged = bytearray(whole)
        damaged[at] ^= 0x01
        (tmp_path / name).write_bytes(bytes(damaged))
        with pytest.raises(tf.errors.DataLossError) as e:
            list(tf.data.TFRecordDataset(str(tmp_path / name)))
        offset = int(re.search(r"corrupted record at (\d+)", str(e.value)).group(1))
        assert tfrecord_files.damaged(str(tmp_path / name), offset) == 3, name
        assert tfrecord_files.damaged(str(tmp_path / "a.tfrecord"), offset) is None  # the same place, intact
    # Unpacked repeated values (a writer other than TensorFlow's may write them so) count as packed ones do.
    floats = b"".join(b"\x0d" + np.float32(v).tobytes() for v in (1, 2, 3))  # FloatList.value, one field each
    ints = bytes([0x08, 0x01, 0x08, 0xAC, 0x02])  # Int64List.value: 1, 300
    feature = {"x": bytes([0x12, len(floats)]) + floats, "y": bytes([0x1A, len(ints)]) + ints}
    entries = b"".join(
        bytes([0x0A, 5 + len(v)]) + b"\x0a\x01" + k.encode() + bytes([0x12, len(v)]) + v for k, v in feature.items()
    )
    record = bytes([0x0A, len(entries)]) + entries
    parsed = tf.io.parse_single_example(
        record, {"x": tf.io.VarLenFeature(tf.float32), "y": tf.io.VarLenFeature(tf.int64)}
    )
    assert parsed["x"].values.numpy().tolist() == [1, 2, 3] and parsed["y"].values.numpy().tolist() == [1, 300]
    assert tfrecord_files.example_features(record) == {"x": ("float32", 3), "y": ("int64", 2)}
    assert tfrecord_files.example_features(tfrecord_files.first_record(str(tmp_path / "a.tfrecord"))) == {
        "x": ("float32", 3),
        "y": ("int64", 1),
    }
    for garbage in (b"\xff\xff", bytes([0x0A, 0x09, 0x0A])):  # a varint that never ends; a field past the end
        with pytest.raises(ValueError):
            tfrecord_files.example_features(garbage)
