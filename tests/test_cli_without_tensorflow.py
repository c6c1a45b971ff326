"""Every config error that does not need TensorFlow is found without it: the command line runs
with TensorFlow (and Keras) made unimportable, and each bad config is still one line, exit 2,
nothing written."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

# Each case: overrides, and what the one line must say. Twenty kinds of mistake.
CASES = [
    (["+stages=0"], "stages=0 must be a positive integer"),
    (["+stages=100000"], "stages=100000 must be a positive integer (at most 512)"),
    (["model=transformer"], "model='transformer' is not known; allowed: builder, conv, keras, mlp"),
    (["optim.lr=0"], "optim.lr=0 must be > 0"),
    (["optim.lr=inf"], "optim.lr=inf must be a finite number"),
    (["data.batch_size=-4"], "data.batch_size=-4 must be >= 1"),
    (["mode=magic"], "mode='magic' is not known; allowed: local, e2e"),
    (["+trainer.stepz=5"], "unknown key trainer.stepz; allowed keys of trainer:"),
    (["trainer.stepz=5"], "unknown key trainer.stepz; allowed keys of trainer:"),
    (["+stages=[{model: conv}"], "cannot read the override"),
    (["+stages=[{modle: {width: 3}}]"], "unknown key stages[0].modle"),
    (["seed=18446744073709551616"], "seed=18446744073709551616 must be <= 4294967295"),
    (["model.depth=100000"], "model.depth=100000 must be <= 1024"),
    (["mode=e2e", "data.batch_size=1000000000000", "pipeline.microbatches=7"],
     "data.batch_size=1000000000000 must be <= 2147483647"),
    (["placement.devices=[/CPU:0]"], "placement.devices has 1 entries, but there are 2 stages"),
    (["placement.devices=[/CPU:0,garbage]"], "placement.devices[1]: 'garbage' is not a device name"),
    (["mode=e2e", "pipeline.microbatches=3"], "pipeline.microbatches=3 does not divide data.batch_size=64"),
    (["mode=e2e", "data=synthetic", "stage.target=value"], "loss=sparse_categorical_crossentropy needs class labels"),
    (["+stages=[{},{model: conv}]"], "stages[1].model=conv needs image input"),
    (["trainer.grad_accum=100"], "trainer.grad_accum=100 x data.batch_size=64 = 6400 examples per step is more than"),
    (["trainer.initial_loss_scale=1000"], "trainer.initial_loss_scale=1000 must be a power of two"),
    (["placement.fallback=mirrored", "placement.replicas=3"], "data.batch_size=64 does not divide over 3 replicas"),
    (["stage.target=colour"], "target='colour' is not a target of data=digits; allowed: label, parity"),
]


@pytest.fixture(scope="module")
def no_tensorflow(tmp_path_factory):
    """A PYTHONPATH entry whose `tensorflow` and `keras` fail to import."""
    root = tmp_path_factory.mktemp("no_tf")
    for name in ("tensorflow", "keras"):
        (root / name).mkdir()
        (root / name / "__init__.py").write_text(f"raise ImportError('{name} was imported')\n")
    return str(root)


def test_the_stand_in_really_blocks_tensorflow(no_tensorflow, tmp_path):
    env = dict(os.environ, PYTHONPATH=no_tensorflow)
    r = subprocess.run([sys.executable, "-c", "import tensorflow"], env=env, capture_output=True, text=True)
    assert "tensorflow was imported" in r.stderr


@pytest.mark.parametrize("overrides, message", CASES, ids=[" ".join(c[0]) for c in CASES])
def test_config_errors_need_no_tensorflow(no_tensorflow, tmp_path, overrides, message):
    env = dict(os.environ, PYTHONPATH=no_tensorflow)
    r = subprocess.run([sys.executable, "-m", "chain", *overrides], cwd=tmp_path, env=env,
                       capture_output=True, text=True, timeout=120)
    lines = [line for line in r.stderr.splitlines() if line.strip()]
    assert r.returncode == 2, r.stderr
    assert len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0], r.stderr
    assert "was imported" not in r.stderr + r.stdout
    assert list(tmp_path.iterdir()) == []  # nothing written, not even Hydra's outputs/
