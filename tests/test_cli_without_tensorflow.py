"""Every config error that does not need TensorFlow is found without it: the command line runs
with TensorFlow (and Keras) made unimportable, and each bad config is still one line, exit 2,
nothing written."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from messages import says

# Each case: overrides, and what the one line must say. Thirty-odd kinds of mistake. `{files}` is a
# folder of small data files (`user_files`); `{keras}` an empty Keras cache.
CASES = [
    (["+stages=0"], "stages=0 must be a positive integer"),
    (["+stages=100000"], "stages=100000 must be a positive integer (at most 512)"),
    (["model=transformer"], "model='transformer' is not known; allowed: builder, conv, gpt, keras, mlp"),
    (["optim.lr=0"], "optim.lr=0 must be > 0"),
    (["optim.lr=inf"], "optim.lr=inf must be a finite number"),
    (["data.batch_size=-4"], "data.batch_size=-4 must be >= 1"),
    (["mode=magic"], "mode='magic' is not known; allowed: local, e2e, side_by_side"),
    (["+trainer.stepz=5"], "unknown key trainer.stepz; allowed keys of trainer:"),
    (["trainer.stepz=5"], "unknown key trainer.stepz; allowed keys of trainer:"),
    (["+stages=[{model: conv}"], "cannot read the override"),
    (["+stages=[{modle: {width: 3}}]"], "unknown key stages[0].modle"),
    (["seed=18446744073709551616"], "seed=18446744073709551616 must be <= 4294967295"),
    (["model.depth=100000"], "model.depth=100000 must be <= 1024"),
    (
        ["mode=e2e", "data.batch_size=1000000000000", "pipeline.microbatches=7"],
        "data.batch_size=1000000000000 must be <= 2147483647",
    ),
    (["placement.devices=[/CPU:0]"], "placement.devices has 1 entry, but there are 2 stages"),
    (
        ["mode=e2e", "placement.plan=auto", "placement.split=[1,1]"],
        "placement.split is what placement.plan=auto chooses: remove it, or set placement.plan=manual",
    ),
    (["placement.devices=[/CPU:0,garbage]"], "placement.devices[1]: 'garbage' is not a device name"),
    (["placement.memory_limit_mb=[100,200,300]"], "placement.memory_limit_mb has 3 entries, but there are 2 stages"),
    (
        ["placement.devices=[/CPU:0,/CPU:1]", "placement.fallback=mirrored"],
        "placement.devices puts each stage on a device, placement.fallback=mirrored puts every stage on every replica",
    ),
    (["mode=e2e", "pipeline.microbatches=3"], "pipeline.microbatches=3 does not divide data.batch_size=64"),
    (["mode=e2e", "data=synthetic", "stage.target=value"], "loss=sparse_categorical_crossentropy needs class labels"),
    (["+stages=[{},{model: conv}]"], "stages[1].model=conv needs image input"),
    (["trainer.grad_accum=100"], "trainer.grad_accum=100 x data.batch_size=64 = 6400 examples per step is more than"),
    (["trainer.initial_loss_scale=1000"], "trainer.initial_loss_scale=1000 must be a power of two"),
    (["placement.fallback=mirrored", "placement.replicas=3"], "data.batch_size=64 does not divide over 3 replicas"),
    (["stage.target=colour"], "target='colour' is not a target of data=digits; allowed: label, parity"),
    (["trainer.steps=5", "trainer.epochs=2"], "trainer.steps=5 and trainer.epochs=2 are both set; give one"),
    (["checkpoint.best=true", "data.val_fraction=0"], "checkpoint.best=true needs validation examples"),
    (["trainer.early_stop_patience=3"], "trainer.early_stop_patience=3 counts evaluations, but trainer.eval_every=0"),
    # The user's data: a missing file, a key not in the arrays, a missing column, a glob matching
    # nothing, an empty Keras cache, data that does not fit the first stage or the batch.
    (
        ["data=npz", "data.path={files}/nothing.npz", "data.y=y"],
        "data.path='{files}/nothing.npz': the file does not exist",
    ),
    (
        ["data=npz", "data.path={files}/a.npz", "data.y=labels"],
        "data.y='labels' is not an array of {files}/a.npz; its arrays: x, y",
    ),
    (["data=npz", "data.path={files}/a.npz"], "data=npz needs its target: data.y=KEY, or data.targets="),
    (
        ["data=csv", "data.path={files}/a.csv", "data.y=colour"],
        "data.y='colour' is not a column of {files}/a.csv; its columns: a, b, label",
    ),
    (
        [
            "data=tfrecord",
            "data.path={files}/*.tfrecord",
            "data.y=label",
            "data.features={x: 'float32[2]', label: int64}",
        ],
        "data.path='{files}/*.tfrecord' matches no file",
    ),
    (
        ["data=keras", "data.name=cifar10"],
        "data=keras data.name=cifar10 reads the local Keras cache, but "
        "{keras}/datasets/cifar-10-batches-py-target/cifar-10-batches-py/data_batch_1 is missing",
    ),
    (
        ["data=npz", "data.path={files}/a.npz", "data.y=y", "data.batch_size=4", "+stages=[{model: conv}]"],
        "stages[0].model=conv needs image input (height, width, channels), but receives shape (5,)",
    ),
    (
        ["mode=e2e", "model=gpt", "data=text", "data.path={files}/a.csv", "data.examples=lines", "data.buckets=[16,8]"],
        "data.buckets=[16,8] must be increasing",
    ),
    (
        ["data=csv", "data.path={files}/a.csv", "data.y=label", "data.batch_size=20"],
        "data.batch_size=20 is larger than data=csv (18 training examples)",
    ),
]


@pytest.fixture(scope="module")
def user_files(tmp_path_factory):
    """A folder with `a.npz` (x: 20 x 5, y: labels) and `a.csv` (columns a, b, label; 20 rows)."""
    root = tmp_path_factory.mktemp("user_files")
    rng = np.random.default_rng(0)
    np.savez(root / "a.npz", x=rng.random((20, 5)), y=np.arange(20) % 3)
    rows = "\n".join(f"{a:.3f},{b:.3f},{k % 2}" for k, (a, b) in enumerate(rng.random((20, 2))))
    (root / "a.csv").write_text("a,b,label\n" + rows + "\n")
    return str(root)


@pytest.fixture(scope="module")
def no_tensorflow(tmp_path_factory):
    """A PYTHONPATH entry whose `tensorflow` and `keras` fail to import."""
    root = tmp_path_factory.mktemp("no_tf")
    for name in ("tensorflow", "keras"):
        (root / name).mkdir()
        (root / name / "__init__.py").write_text(f"raise ImportError('{name} was imported')\n")
    return str(root)


def test_the_stand_in_really_blocks_tensorflow(no_tensorflow, tmp_path):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([no_tensorflow, os.environ.get("PYTHONPATH", "")]))
    r = subprocess.run([sys.executable, "-c", "import tensorflow"], env=env, capture_output=True, text=True)
    assert "tensorflow was imported" in r.stderr


@pytest.mark.parametrize("overrides, message", CASES, ids=[" ".join(c[0]) for c in CASES])
def test_config_errors_need_no_tensorflow(no_tensorflow, user_files, tmp_path_factory, tmp_path, overrides, message):
    keras_home = str(tmp_path_factory.mktemp("keras_home"))  # an empty Keras cache
    overrides = [o.replace("{files}", user_files) for o in overrides]
    message = message.replace("{files}", user_files).replace("{keras}", keras_home)
    env = dict(
        os.environ, PYTHONPATH=os.pathsep.join([no_tensorflow, os.environ.get("PYTHONPATH", "")]), KERAS_HOME=keras_home
    )  # the stand-in first; then this checkout, if it is on the path
    r = subprocess.run(
        [sys.executable, "-m", "chain", *overrides], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120
    )
    lines = [line for line in r.stderr.splitlines() if line.strip()]
    assert r.returncode == 2, r.stderr
    assert len(lines) == 1 and lines[0].startswith("error: ") and says(lines[0], message), r.stderr
    assert "was imported" not in r.stderr + r.stdout
    assert list(tmp_path.iterdir()) == []  # nothing written, not even Hydra's outputs/


# What the preparation pass finds beyond the config's own checks: a schedule's name (the config
# does not know the schedules), the planner's rules and the memory estimate on a machine without
# GPUs, a profile window outside mode=e2e. Also raised without TensorFlow.
PREPARED = [
    (
        ["mode=e2e", "pipeline.schedule=zigzag"],
        "pipeline.schedule='zigzag' is not known; allowed: sequential, gpipe, 1f1b, eager1f1b, zb1, interleaved, zbv, file",
    ),
    (
        ["mode=e2e", "pipeline.schedule=file"],
        "pipeline.schedule=file reads the schedule from pipeline.schedule_file, which is not set",
    ),
    (
        ["mode=e2e", "+stages=3", "pipeline.schedule=interleaved", "pipeline.virtual_stages=2"],
        "pipeline.virtual_stages=2 does not divide the 3 stages",
    ),
    (["placement.fallback=error"], "placement.fallback=error: 2 stages need 2 GPUs, 0 visible"),
    (["placement.cpu_memory_mb=1", "model.width=4096"], "allowed (placement.cpu_memory_mb)"),
    (["trainer.profile=[1,2]"], "trainer.profile measures a pipeline schedule's actions: it needs mode=e2e"),
]
# Configs that prepare whole: (layout, per-replica batch, data described).
VALID = [
    (["+stages=3"], ["pipeline", 64, True]),
    (["placement.fallback=mirrored", "data.batch_size=64"], ["mirrored", 32, True]),
]

PREPARE = r"""
import json, sys
from chain.config import normalize_overrides
from chain.config.hydra import compose_config
from chain.errors import ChainError
from chain.planning.inventory import Inventory
from chain.prepared import prepare

out = []
for overrides in json.loads(sys.argv[1]):
    try:
        spec = prepare(compose_config(normalize_overrides(overrides)), inventory=Inventory())  # no GPU
        out.append([0, [spec.assignment.topology, spec.batch_cut.per_replica, spec.data_info is not None]])
    except ChainError as e:
        out.append([e.exit_code, str(e)])
print(json.dumps([out, sorted(m for m in ("tensorflow", "keras") if m in sys.modules)]))
"""


def test_the_preparation_pass_raises_every_such_error_without_tensorflow(
    no_tensorflow, user_files, tmp_path_factory, tmp_path
):
    """`chain.prepared.prepare`, the one pass before TensorFlow starts, in one process that cannot import
    it: the pass's own cases and those of the cases above that reach furthest into it (the command
    line runs every case above through its first half, `chain.prepared.check_config`), one line each, exit code
    2; and a good config planned whole (its per-replica batch on the placement)."""
    keras_home = str(tmp_path_factory.mktemp("keras_home"))
    # The cases that reach furthest: the placement, the user's files and the Keras cache (each
    # composition costs ~0.3 s on a loaded machine, so not every case above again).
    reach = ("placement.", "data=npz", "data=keras", "pipeline.schedule", "trainer.profile")
    cases = [
        (
            [o.replace("{files}", user_files) for o in overrides],
            message.replace("{files}", user_files).replace("{keras}", keras_home),
        )
        for overrides, message in CASES + PREPARED
        if any(o.startswith(reach) for o in overrides)
    ]
    assert len(cases) == 17
    env = dict(
        os.environ, PYTHONPATH=os.pathsep.join([no_tensorflow, os.environ.get("PYTHONPATH", "")]), KERAS_HOME=keras_home
    )
    r = subprocess.run(
        [sys.executable, "-c", PREPARE, json.dumps([o for o, _ in cases] + [o for o, _ in VALID])],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr
    results, imported = json.loads(r.stdout)
    assert imported == []
    for (overrides, message), (code, line) in zip(cases, results):
        assert code == 2 and says(line, message) and "\n" not in line, (overrides, line)
    assert [line for _, line in results[len(cases) :]] == [planned for _, planned in VALID]
    assert list(tmp_path.iterdir()) == []
