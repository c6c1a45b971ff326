"""Stages on TensorFlow cluster workers (`python -m chain.worker`) on loopback: the same training as
on local logical devices, a lost worker stops the client fast with one line, a resume after
the worker is back is bit-exact, and an unreachable worker fails at once. The workers are
always shut down, also when a test fails."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from chain.worker import LocalCluster, free_addresses
from compare import assert_values_alike
from conftest import manifest, run_cli, stage_values

TINY = ["+stages=2", "model.width=16", "data.batch_size=32", "trainer.progress=false", "checkpoint.export=false"]
MODES = {"e2e": ["mode=e2e", "pipeline.schedule=1f1b", "pipeline.microbatches=2"], "local": ["mode=local"]}


@pytest.fixture
def workers():
    with LocalCluster(2) as cluster:
        yield cluster


def final(run_dir) -> dict:
    return {k: stage_values(run_dir, f"stage_{k:02d}") for k in range(2)}


@pytest.mark.parametrize("mode", MODES)
def test_a_chain_on_two_workers_trains_like_on_local_devices(workers, tmp_path, mode):
    args = [*TINY, *MODES[mode], "trainer.steps=6"]
    r = run_cli(tmp_path, *args, workers.option, f"hydra.run.dir={tmp_path / 'cluster'}")
    assert r.returncode == 0, r.stderr
    for k, address in enumerate(workers.addresses):  # the placement table names each stage's worker
        assert f"/job:worker/replica:0/task:{k}/device:CPU:0  worker {k} {address} CPU:0" in r.stdout
    r = run_cli(tmp_path, *args, f"hydra.run.dir={tmp_path / 'local'}")
    assert r.returncode == 0, r.stderr
    a, b = final(tmp_path / "cluster"), final(tmp_path / "local")
    for k in range(2):
        assert_values_alike(a[k], b[k], rtol=1e-6)


def test_a_lost_worker_stops_the_run_with_one_line_and_the_resume_is_bit_exact(workers, tmp_path):
    args = [*TINY, *MODES["e2e"], "trainer.steps=24", "checkpoint.every=4", workers.option]
    straight, victim = str(tmp_path / "straight"), str(tmp_path / "victim")
    r = run_cli(tmp_path, *args, f"hydra.run.dir={straight}")
    assert r.returncode == 0, r.stderr
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", CHAIN_TEST_ANNOUNCE="1")
    env.pop("TF_CPP_MIN_LOG_LEVEL")  # as a user runs it: the CLI quiets TensorFlow's own gRPC errors
    client = subprocess.Popen([sys.executable, "-m", "chain", *args, f"hydra.run.dir={victim}"], cwd=tmp_path,
                              env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        lines = []
        for line in client.stderr:
            lines.append(line)
            if "test-hook: step 9 done" in line:
                break
        workers.kill(1)
        killed = time.monotonic()
        rest = client.stderr.read()
        code = client.wait(timeout=60)
        took = time.monotonic() - killed
    finally:
        client.kill()
    errors = [line for line in rest.splitlines() if line.strip() and not line.startswith("test-hook")]
    assert code == 5 and len(errors) == 1, rest
    assert errors[0].startswith(f"error: cluster worker 1 ({workers.addresses[1]}) is lost"), errors[0]
    assert errors[0].endswith("is intact: resume with resume=true"), errors[0]
    assert took < 20, took  # seconds, not minutes
    saved = manifest(victim)["step"]
    assert 8 <= saved < 24
    workers.start(1)  # the worker is back (a fresh process: its variables come from the checkpoint)
    r = run_cli(tmp_path, *args, f"hydra.run.dir={victim}", "resume=true")
    assert r.returncode == 0, r.stderr
    a, b = final(straight), final(victim)
    for k in range(2):
        assert_values_alike(a[k], b[k])


def test_an_unreachable_worker_fails_fast_naming_it(tmp_path):
    port = free_addresses(1)[0].split(":")[1]
    started = time.monotonic()
    r = run_cli(tmp_path, *TINY, f"cluster.workers=[localhost:{port}]")
    assert time.monotonic() - started < 60
    assert r.returncode == 2 and r.stderr.strip() == (
        f"error: cluster.workers[0]=localhost:{port} is not reachable (Connection refused); start it with: "
        f"python -m chain.worker --index 0 --cluster localhost:{port}")
    assert not (tmp_path / "outputs").exists()
