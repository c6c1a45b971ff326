"""The user's data: every source (npz, csv, tfrecord, the Keras cache, a function called through
Hydra) on small files the tests write. Each is read whole, split into training and validation
examples by a seeded draw, checked once before training with the rules `Run.step` applies, and
trained through the one input pipeline; bad input is one line naming the key."""

from __future__ import annotations

import collections
import dataclasses
import gzip
import importlib
import os
import pkgutil
import pickle
import shutil

import numpy as np
import pytest
import tensorflow as tf
from omegaconf import OmegaConf

import chain
import chain.prepared
from chain.config import checks, schema
from chain.data import describe, load
from chain.data import sources as sources_lib
from chain.data.data_source import Source
from chain.data.loader import split
from chain.data.sources import SOURCES, collect
from chain.data.sources.csv import csv_table
from chain.data.sources.digits_data import DIGITS_EXAMPLES, DIGITS_SHAPE
from chain.data.sources.keras import keras_cache
from chain.data.sources.npz import npz_members
from conftest import run_cli, run_dirs
from user_datasets import arrays

SMALL = ["+stages=2", "model.width=8", "model.depth=1", "data.batch_size=8", "trainer.progress=false"]
N, HELD = 60, 6  # examples in the files, and what val_fraction=0.1 holds out of them


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    """The test's files and the arrays they hold: images.npz (x: 60 x 4 x 4 x 1, y: 0/1 labels,
    v: values, z: labels 0/3), val.npz (10 more), table.csv (features f1..f3, label 0..2, value), and
    records-0/1.tfrecord (the images and labels of images.npz, in two files)."""
    root = tmp_path_factory.mktemp("user_data")
    rng = np.random.default_rng(0)
    x = rng.random((N, 4, 4, 1)).astype("float32")
    y = (x.reshape(N, -1).sum(1) > 8).astype("int64")
    v = x.reshape(N, -1).mean(1)
    np.savez(root / "images.npz", x=x, y=y, v=v, z=3 * y)
    np.savez(root / "val.npz", x=x[:10] + 1, y=y[:10], v=v[:10])
    table = np.column_stack([rng.random((N, 3)).round(4), np.arange(N) % 3, rng.random(N).round(3)])
    (root / "table.csv").write_text("f1,f2,f3,label,value\n" + "\n".join(",".join(f"{c:g}" for c in r) for r in table))
    for part in range(2):
        with tf.io.TFRecordWriter(str(root / f"records-{part}.tfrecord")) as w:
            for i in range(part * 30, part * 30 + 30):
                feature = {
                    "image": tf.train.Feature(float_list=tf.train.FloatList(value=x[i].ravel())),
                    "digit": tf.train.Feature(int64_list=tf.train.Int64List(value=[int(y[i])])),
                }
                w.write(tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString())
    (root / "late").mkdir()  # records of images.npz, but the 6th holds 8 floats: past the first record checked
    with tf.io.TFRecordWriter(str(root / "late" / "records.tfrecord")) as w:
        for i in range(10):
            feature = {
                "image": tf.train.Feature(float_list=tf.train.FloatList(value=x[i].ravel()[: 8 if i == 5 else 16])),
                "digit": tf.train.Feature(int64_list=tf.train.Int64List(value=[int(y[i])])),
            }
            w.write(tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString())
    return {"root": str(root), "x": x, "y": y, "v": v, "table": table}


def npz(data, *more):
    return ["data=npz", f"data.path={data['root']}/images.npz", *more]


def test_npz_trains_on_a_seeded_split_of_its_examples(data):
    run = chain.build(chain.compose([*SMALL, *npz(data, "data.y=y"), "trainer.steps=3"]))
    info = run.dataset.info
    assert (info.input_shape, info.examples, info.val_examples) == ((4, 4, 1), N - HELD, HELD)
    assert [(t.name, t.classes) for t in info.targets] == [("label", 2)]  # integers: classes, max + 1
    train, held = split(N, HELD, seed=0)
    assert sorted(set(train) | set(held)) == list(range(N)) and not set(train) & set(held)
    np.testing.assert_array_equal(run.dataset.x, data["x"][train])
    np.testing.assert_array_equal(run.dataset.val_x, data["x"][held])
    np.testing.assert_array_equal(run.dataset.val_y["label"], data["y"][held])
    assert np.isfinite(run.fit()["loss_last"])
    assert np.array_equal(split(N, HELD, seed=0)[1], held)  # the same on every run with this seed
    assert not np.array_equal(split(N, HELD, seed=1)[1], held)


def test_npz_several_targets_and_a_validation_file(data):
    s = chain.compose(
        [
            *SMALL,
            *npz(data, "data.targets={label: y, value: v}", f"data.val_path={data['root']}/val.npz"),
            "+stages=[{},{target: value}]",
            "trainer.steps=2",
        ]
    )
    run = chain.build(s)
    assert [(t.name, t.classes) for t in run.dataset.info.targets] == [("label", 2), ("value", 0)]
    np.testing.assert_array_equal(run.dataset.x, data["x"])  # nothing held out: the file validates
    np.testing.assert_array_equal(run.dataset.val_x, data["x"][:10] + 1)
    summary = run.fit()
    assert set(summary["stages"][0]["val"]) == {"loss", "accuracy"}
    assert set(summary["stages"][1]["val"]) == {"loss", "mae"}


def test_csv_reads_columns_by_name(data):
    path = f"{data['root']}/table.csv"
    run = chain.build(
        chain.compose(
            [
                *SMALL,
                "data=csv",
                f"data.path={path}",
                "data.y=label",
                "data.x=[f3,f1]",
                "data.val_fraction=0.2",
                "trainer.steps=2",
            ]
        )
    )
    train, held = split(N, 12, seed=0)
    np.testing.assert_allclose(run.dataset.x, data["table"][train][:, [2, 0]].astype("float32"))
    assert run.dataset.y["label"].dtype == np.int32 and run.dataset.info.targets[0].classes == 3
    np.testing.assert_array_equal(run.dataset.val_y["label"], data["table"][held, 3])
    assert np.isfinite(run.fit()["loss_last"])
    # The other columns are the inputs unless data.x says otherwise; data.classes makes whole numbers a value.
    s = chain.compose([*SMALL, "data=csv", f"data.path={path}", "data.y=label", "data.classes={label: 0}"])
    assert describe(s.data).input_shape == (4,)  # f1, f2, f3, value
    assert describe(s.data).targets[0].is_regression


def test_tfrecord_reads_the_declared_features(data):
    run = chain.build(
        chain.compose(
            [
                *SMALL,
                "data=tfrecord",
                f"data.path={data['root']}/records-*.tfrecord",
                "data.x=image",
                "data.y=digit",
                "trainer.steps=2",
                "+stages=[{model: conv},{}]",
                "data.features={image: 'float32[4,4,1]', digit: int64}",
            ]
        )
    )
    train, held = split(N, HELD, seed=0)
    np.testing.assert_array_equal(run.dataset.x, data["x"][train])  # both files, in order
    np.testing.assert_array_equal(run.dataset.val_y["label"], data["y"][held])
    assert np.isfinite(run.fit()["loss_last"])


def test_a_function_through_hydra_with_keyword_arguments():
    s = chain.compose(
        [
            *SMALL,
            "data=callable",
            "data._target_=user_datasets.make_dataset",
            "+data.n=40",
            "+data.several=true",
            "+stages=[{},{target: val}]",
            "trainer.epochs=2",
        ]
    )
    assert s.data.kwargs == {"n": 40, "several": True} and s.trainer.steps is None  # known once loaded
    run = chain.build(s)
    x, ys = arrays(40)
    train, held = split(40, 4, seed=0)
    np.testing.assert_array_equal(run.dataset.x, x[train])
    np.testing.assert_array_equal(run.dataset.val_y["val"], ys["val"][held])
    assert [(t.name, t.classes) for t in run.dataset.info.targets] == [("cls", 2), ("val", 0)]
    assert run.settings.trainer.steps == 9  # 2 epochs of 36 training examples in batches of 8: ceil(72 / 8)
    assert run.fit()["steps"] == 9


def write_keras_cache(root, n: int, test: int) -> None:
    """Stand-ins for Keras' cache files of mnist, fashion_mnist and cifar10, with n + test examples."""
    d = os.path.join(root, "datasets")
    rng = np.random.default_rng(0)

    def images(k, *shape):
        return rng.integers(0, 256, (k, *shape), dtype=np.uint8)

    labels = (np.arange(n) % 10).astype(np.uint8)
    test_labels = (np.arange(test) % 10).astype(np.uint8)
    os.makedirs(os.path.join(d, "fashion-mnist"))
    np.savez(
        os.path.join(d, "mnist.npz"),
        x_train=images(n, 28, 28),
        y_train=labels,
        x_test=images(test, 28, 28),
        y_test=test_labels,
    )
    for name, array, offset in (
        ("train-labels-idx1-ubyte.gz", labels, 8),
        ("train-images-idx3-ubyte.gz", images(n, 28, 28), 16),
        ("t10k-labels-idx1-ubyte.gz", test_labels, 8),
        ("t10k-images-idx3-ubyte.gz", images(test, 28, 28), 16),
    ):
        with gzip.open(os.path.join(d, "fashion-mnist", name), "wb") as f:
            f.write(b"\0" * offset + array.tobytes())
    cifar = os.path.join(d, "cifar-10-batches-py-target", "cifar-10-batches-py")
    os.makedirs(cifar)
    for name, k in [(f"data_batch_{i}", n // 5) for i in range(1, 6)] + [("test_batch", test)]:
        with open(os.path.join(cifar, name), "wb") as f:
            pickle.dump({b"data": images(k, 3 * 32 * 32), b"labels": [int(c) for c in np.arange(k) % 10]}, f)


@pytest.mark.parametrize(
    "name, shape", [("mnist", (28, 28, 1)), ("fashion_mnist", (28, 28, 1)), ("cifar10", (32, 32, 3))]
)
def test_keras_data_sets_come_from_the_local_cache(tmp_path, monkeypatch, name, shape):
    write_keras_cache(tmp_path, 20, 10)
    monkeypatch.setenv("KERAS_HOME", str(tmp_path))
    monkeypatch.setitem(keras_cache.KERAS, name, dataclasses.replace(keras_cache.KERAS[name], train=20, test=10))
    ds = load(chain.compose(["data=keras", f"data.name={name}", "data.batch_size=8"]).data, 0)
    assert (ds.info.input_shape, ds.info.examples, ds.info.val_examples) == (shape, 20, 10)  # the test split validates
    assert ds.x.dtype == np.float32 and 0 <= ds.x.min() and ds.x.max() <= 1 and ds.x.max() > 0.9
    np.testing.assert_array_equal(ds.y["label"], np.arange(20) % 10 if name != "cifar10" else np.arange(20) % 4)
    held = load(
        chain.compose(["data=keras", f"data.name={name}", "data.batch_size=8", "data.val_fraction=0.25"]).data, 0
    )
    assert (held.info.examples, held.info.val_examples) == (15, 5)  # a share of the training split instead


def test_keras_offline_without_the_file_says_where_and_how_to_fill_it(tmp_path, monkeypatch):
    monkeypatch.setenv("KERAS_HOME", str(tmp_path))
    with pytest.raises(chain.ConfigError) as e:
        chain.compose(["data=keras", "data.name=fashion_mnist"])
    path = tmp_path / "datasets" / "fashion-mnist" / "train-labels-idx1-ubyte.gz"
    assert str(e.value) == (
        f"data=keras data.name=fashion_mnist reads the local Keras cache, but {path} is missing (chain never "
        "downloads); fill it on a machine with internet (python -c 'import keras; keras.datasets.fashion_mnist."
        f"load_data()') and copy what that writes under ~/.keras/datasets/ into {tmp_path / 'datasets'}, or set "
        "KERAS_HOME to a directory whose datasets/ holds it"
    )


def test_digits_are_what_the_catalog_says():
    ds = load(chain.compose([]).data, 0)
    assert ds.x.shape[1:] == DIGITS_SHAPE and len(ds.x) + len(ds.val_x) == DIGITS_EXAMPLES
    assert len(ds.val_x) == 180  # data.val_fraction unset: 0.1 held out
    x = np.concatenate([ds.x, ds.val_x])
    assert set(np.unique(x * 16.0)) == set(range(17))  # pixel counts 0..16, scaled to [0, 1]
    labels = np.concatenate([ds.y["label"], ds.val_y["label"]])
    assert np.bincount(labels).tolist() == [178, 182, 177, 183, 181, 182, 181, 179, 174, 180]  # UCI's test set
    assert (np.concatenate([ds.y["parity"], ds.val_y["parity"]]) == labels % 2).all()


BAD = {
    "missing column": (
        ["data=csv", "data.path={root}/table.csv", "data.y=colour"],
        "data.y='colour' is not a column of {root}/table.csv; its columns: f1, f2, f3, label, value",
    ),
    "missing key": (
        ["data=npz", "data.path={root}/images.npz", "data.targets={label: y, size: s}"],
        "data.targets.size='s' is not an array of {root}/images.npz; its arrays: x, y, v, z",
    ),
    "no file": (
        ["data=npz", "data.path={root}/imagez.npz", "data.y=y"],
        "data.path='{root}/imagez.npz': the file does not exist",
    ),
    "glob matching nothing": (
        [
            "data=tfrecord",
            "data.path={root}/*.tfrec",
            "data.y=digit",
            "data.features={x: 'float32[16]', digit: int64}",
        ],
        "data.path='{root}/*.tfrec' matches no file",
    ),
    "undeclared feature": (
        [
            "data=tfrecord",
            "data.path={root}/*.tfrecord",
            "data.y=digit",
            "data.features={image: 'float32[16]', digit: int64}",
        ],
        "data.x='x' is not in data.features (image, digit); declare every feature read",
    ),
    "both y and targets": (
        ["data=npz", "data.path={root}/images.npz", "data.y=y", "data.targets={a: y}"],
        "data.y and data.targets are both set; give one",
    ),
    "val_path and val_fraction": (
        [
            "data=npz",
            "data.path={root}/images.npz",
            "data.y=y",
            "data.val_path={root}/val.npz",
            "data.val_fraction=0.2",
        ],
        "data.val_fraction=0.2 and data.val_path are both set; give one",
    ),
    "no example axis": (
        ["data=npz", "data.path={root}/images.npz", "data.x=v", "data.y=y"],
        "data.x='v' in {root}/images.npz has shape (60,); expected one example per row",
    ),
    "a conv stage on flat data": (
        ["data=csv", "data.path={root}/table.csv", "data.y=label", "+stages=[{model: conv}]"],
        "stages[0].model=conv needs image input (height, width, channels), but receives shape (4,)",
    ),
    "records that do not parse": (
        [
            "data=tfrecord",
            "data.path={root}/*.tfrecord",
            "data.x=image",
            "data.y=digit",
            "data.features={image: 'float32[8]', digit: int64}",
        ],
        "data.path: record 0 of {root}/records-0.tfrecord is not as data.features declares "
        "it: feature image holds 16 values, declared float32[8] (each file's first record is "
        "checked before training)",
    ),
    # Found once the data is read (TensorFlow reads TFRecords and runs the function), still before training:
    "a record past the first that does not parse": (
        [
            "data=tfrecord",
            "data.path={root}/late/*.tfrecord",
            "data.x=image",
            "data.y=digit",
            "data.features={image: 'float32[16]', digit: int64}",
        ],
        "data.path='{root}/late/*.tfrecord' with data.features cannot be read: InvalidArgumentError",
    ),
    "labels out of range": (
        ["data=npz", "data.path={root}/images.npz", "data.y=z", "data.classes={label: 3}"],
        "data.y='z'[{first}] = 3 is out of range: target 'label' has 3 classes, 0..2",
    ),
    "not a dataset": (
        ["data=callable", "data._target_=user_datasets.not_a_dataset"],
        "data._target_=user_datasets.not_a_dataset returned list; it must return a tf.data.Dataset",
    ),
    "a flat function on a conv stage": (
        ["data=callable", "data._target_=user_datasets.make_dataset", "+stages=[{model: conv}]"],
        "stages[0].model=conv needs image input (height, width, channels), but receives shape (6,)",
    ),
    "reals where labels are classes": (
        ["data=npz", "data.path={root}/images.npz", "data.y=v", "data.classes={value: 3}"],
        "data.y='v'[0] = ",
    ),
}


@pytest.mark.parametrize("case", BAD)
def test_bad_user_data_is_one_line_naming_the_key(data, case):
    overrides, message = BAD[case]
    overrides = [o.replace("{root}", data["root"]) for o in overrides]
    with pytest.raises(chain.ChainError) as e:
        chain.build(chain.compose([*SMALL, *overrides]))
    assert "\n" not in str(e.value)
    first = np.flatnonzero(data["y"])[0]  # the first example labelled 1 (in z: 3)
    assert str(e.value).startswith(message.replace("{root}", data["root"]).replace("{first}", str(first))), str(e.value)


def test_data_found_bad_once_read_stops_the_command_line_with_nothing_left_behind(data, tmp_path):
    """A conv stage on TFRecord inputs that are flat: only known once TensorFlow read the records,
    which happens after Hydra made the run directory; the run stops before training and removes it."""
    r = run_cli(
        tmp_path,
        "data=tfrecord",
        f"data.path={data['root']}/records-*.tfrecord",
        "data.x=image",
        "data.y=digit",
        "data.features={image: 'float32[16]', digit: int64}",
        "+stages=[{model: conv},{}]",
        "data.batch_size=8",
        "trainer.steps=2",
    )
    lines = [line for line in r.stderr.splitlines() if line.strip()]
    assert r.returncode == 2, r.stderr
    assert lines == [
        "error: stages[0].model=conv needs image input (height, width, channels), but receives shape "
        "(16,); put conv stages first and use data=digits"
    ], r.stderr
    assert run_dirs(tmp_path) == [] and not os.path.exists(tmp_path / "outputs")


def _counted(monkeypatch, name: str) -> collections.Counter:
    """Calls of source `name`'s description and reader, and of the settings' checks against the data."""
    calls: collections.Counter = collections.Counter()
    source, check_data = SOURCES[name], checks.check_data

    def counted(key, fn):
        def call(*args):
            calls[key] += 1
            return fn(*args)

        return call

    monkeypatch.setitem(
        SOURCES, name, Source(source.settings, counted("describe", source.describe), counted("read", source.read))
    )
    monkeypatch.setattr(checks, "check_data", counted("check_data", check_data))
    return calls


def test_a_build_describes_checks_and_reads_the_data_set_once(data, tmp_path, monkeypatch):
    """The preparation pass describes the data and checks the settings against it once; the loader
    takes that description and reads each array of an .npz file once (its labels, read for the
    description, are not read again), each CSV file once."""
    for name in ("images.npz", "table.csv"):  # versions of the files no earlier test read
        shutil.copy(os.path.join(data["root"], name), tmp_path / name)
    reads: collections.Counter = collections.Counter()
    npz_array, opened = npz_members.npz_array, []
    monkeypatch.setattr(
        npz_members, "npz_array", lambda path, array, *rest: (reads.update([array]), npz_array(path, array, *rest))[1]
    )
    monkeypatch.setattr(
        csv_table, "open", lambda path, *a, **k: (opened.append(path), open(path, *a, **k))[1], raising=False
    )  # the CSV reader's open
    calls = _counted(monkeypatch, "npz")
    spec = chain.prepare([*SMALL, "data=npz", f"data.path={tmp_path}/images.npz", "data.y=y", "trainer.steps=1"])
    assert isinstance(spec, chain.prepared.RunSpec) and spec.batch_cut.per_replica == 8
    run = chain.build(spec)
    assert run.dataset.info is spec.data_info
    assert calls == {"describe": 1, "check_data": 1, "read": 1}
    assert reads == {"x": 1, "y": 1}
    calls = _counted(monkeypatch, "csv")
    chain.build(chain.compose([*SMALL, "data=csv", f"data.path={tmp_path}/table.csv", "data.y=label"]))
    assert calls["read"] == 1 and calls["check_data"] == 1 and opened == [f"{tmp_path}/table.csv"]


@pytest.mark.parametrize("source", ["text", "tfrecord"])
@pytest.mark.parametrize("old, new", [("files", "path"), ("val_files", "val_path")])
def test_every_source_names_its_files_data_path_and_the_old_spelling_says_so(source, old, new):
    """One key for one idea: the files of every source are `data.path` and `data.val_path`; the old
    spelling of `data=text` and `data=tfrecord` is one line naming the new key."""
    assert not any(
        {"files", "val_files"} & {f.name for f in dataclasses.fields(c)} for c in sources_lib.settings_classes()
    )
    with pytest.raises(
        chain.ConfigError, match=rf"^unknown key data\.{old}; allowed keys of data: .*; did you mean data\.{new}\?$"
    ):
        chain.prepared.check_config(chain.compose([f"data={source}", f"data.{old}=x"]))


def test_the_stream_keys_are_declared_once():
    """`stream`, `shuffle_buffer` and `on_bad_record` come from the one mixin of the sources that
    stream (`StreamSettings`, `BadRecords`), never declared by a source itself."""
    from chain.data.data_source import BadRecords, StreamSettings

    streaming = [c for c in sources_lib.settings_classes() if issubclass(c, StreamSettings)]
    assert {c.KIND for c in streaming} == {"csv", "npz", "tfrecord", "callable"}
    declared = {
        (c.__name__, key)
        for settings in sources_lib.settings_classes()
        for c in settings.__mro__
        for key in ("stream", "shuffle_buffer", "on_bad_record")
        if key in vars(c).get("__annotations__", {}) and c not in (StreamSettings, BadRecords)
    }
    assert declared == set()


def test_each_source_is_one_module_with_its_settings_description_and_reader(tmp_path, monkeypatch):
    """The registry holds exactly the modules and folders of chain/data/sources, each defining its
    settings, its description and its reader in one module; each has its conf/data yaml; the schema's
    `data` forms are theirs; and a new module registers by being there."""
    modules = sorted(m.name for m in pkgutil.iter_modules(sources_lib.__path__))
    assert {"csv", "npz", "tfrecord", "tokens", "text", "function", "keras"} <= set(modules)  # a folder each
    found = {m: importlib.import_module(f"chain.data.sources.{m}").SOURCE for m in modules}
    assert set(SOURCES.values()) == set(found.values()) and len(modules) == len(set(found.values()))
    for module, source in found.items():
        where = {source.settings.__module__, source.describe.__module__, source.read.__module__}
        assert len(where) == 1 and where.pop().startswith(f"chain.data.sources.{module}")
    conf = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "conf", "data")
    named = {
        OmegaConf.load(os.path.join(conf, f)).get("name") or f[:-5]  # data=callable: chosen by _target_
        for f in os.listdir(conf)
        if f.endswith(".yaml")
    }
    assert {SOURCES[n] for n in named} == set(found.values())
    assert set(schema.DataSets) == {s.settings for s in found.values()}
    (tmp_path / "more_sources").mkdir()
    (tmp_path / "more_sources" / "__init__.py").write_text("")
    (tmp_path / "more_sources" / "toy_data.py").write_text(
        "from dataclasses import dataclass\nfrom typing import ClassVar\n"
        "from chain.data.data_source import DataSet, Source\n\n\n"
        "@dataclass(frozen=True, kw_only=True)\nclass Toy(DataSet):\n    KIND: ClassVar[str] = 'toy'\n\n\n"
        "SOURCE = Source(Toy, lambda data: None, lambda data, seed, info: None)\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    assert list(collect("more_sources", [str(tmp_path / "more_sources")])) == ["toy"]
    (tmp_path / "more_sources" / "bare.py").write_text("X = 1\n")
    with pytest.raises(TypeError, match="more_sources.bare defines no SOURCE"):
        collect("more_sources", [str(tmp_path / "more_sources")])
