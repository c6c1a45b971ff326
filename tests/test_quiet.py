"""The console says only what matters: TensorFlow's start-up banner and its known harmless lines (Grappler's
`layout failed` under trainer.grad_accum, a mirrored step's `Reduce to ... then broadcast to` INFO lines, the
checkpoint saver's retracing warning on cluster workers) reach neither stream, from the command line, the
Python API or an example, each started as a user starts it (TF_CPP_MIN_LOG_LEVEL not set); TensorFlow's own
error text still reaches chain's error line."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from chain.worker import LocalCluster
from conftest import run_cli

ROOT = Path(__file__).resolve().parents[1]
TINY = ["+stages=2", "model.width=16", "data.batch_size=32", "trainer.progress=false", "checkpoint.export=false"]
# absl's C++ lines (I0000/W0000/E0000 ...), its pre-init notice, Python's tensorflow logger (its own format and Hydra's)
TENSORFLOW = re.compile(r"^[IWEF]\d{4} |absl::InitializeLog|WARNING:tensorflow|\[tensorflow\]|oneDNN|cpu_feature_guard|"
                        r"cuInit|topological order|then broadcast to|retracing", re.M)


def as_a_user(*args: str, cwd) -> subprocess.CompletedProcess:
    """A fresh `python ARGS` in `cwd` with TensorFlow's log level left to chain (not the test zygote's)."""
    env = {k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"}
    return subprocess.run([sys.executable, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


def assert_quiet(r: subprocess.CompletedProcess) -> None:
    assert r.returncode == 0, r.stderr[-3000:]
    for stream in (r.stdout, r.stderr):
        assert not TENSORFLOW.search(stream), stream


def test_grad_accum_the_python_api_and_the_example_start_and_train_quietly(tmp_path):
    r = as_a_user("-m", "chain", *TINY, "trainer.steps=2", "trainer.grad_accum=4", cwd=tmp_path)
    assert_quiet(r)
    assert r.stderr == ""
    api = ("import chain\n"
           f"run = chain.build(chain.compose({[*TINY, 'trainer.steps=2', 'trainer.grad_accum=4']!r}))\n"
           "print(run.fit()['steps'])\n")
    r = as_a_user("-c", api, cwd=tmp_path)
    assert_quiet(r)
    assert (r.stdout, r.stderr) == ("2\n", "")
    r = as_a_user(str(ROOT / "examples" / "make_digits_model.py"), "m.keras", cwd=tmp_path)
    assert_quiet(r)
    assert (r.stdout, r.stderr) == ("wrote m.keras\n", "")


def test_the_mirrored_fallback_and_a_resume_on_cluster_workers_print_no_tensorflow_lines(tmp_path):
    # Python's logging only: the test zygote's TensorFlow (its C++ log level set at its import) will do
    assert_quiet(run_cli(tmp_path, *TINY, "trainer.steps=2", "placement.fallback=mirrored"))
    with LocalCluster(2) as cluster:
        args = [*TINY, "mode=e2e", "pipeline.microbatches=2", "checkpoint.every=1", cluster.option,
                f"hydra.run.dir={tmp_path / 'cluster'}"]
        assert run_cli(tmp_path, *args, "trainer.steps=1").returncode == 0  # the checkpoint to resume (not checked)
        # 3 more saves of 2 stages, each spanning the client and a worker: TensorFlow's saver retraces from the 5th
        assert_quiet(as_a_user("-m", "chain", *args, "trainer.steps=4", "resume=true", cwd=tmp_path))
        # a worker that cannot serve: TensorFlow's own words in chain's one line
        r = as_a_user("-m", "chain.worker", "--index", "0", "--cluster", cluster.addresses[0], cwd=tmp_path)
    assert r.returncode == 2 and len(r.stderr.splitlines()) == 1, r.stderr
    assert r.stderr.startswith(f"error: worker 0 cannot serve {cluster.addresses[0]}: "), r.stderr
