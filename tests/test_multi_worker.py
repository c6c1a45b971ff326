"""`placement.fallback=mirrored` across hosts: every worker of TF_CONFIG runs the same command and
trains the whole chain data parallel (MultiWorkerMirroredStrategy). Two such workers on
loopback train like one process mirrored over two logical CPU replicas, on the same global
batches (a streamed data set: each host reading only its own replica's files); a host that dies
or stops answering stops the others with one line (exit 5); a TF_CONFIG task without the mirrored
fallback is one line."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time

import pytest
import tensorflow as tf

import chain

from chain.worker import free_addresses
from compare import assert_values_alike
from conftest import EXTENDED, read_summary, run_cli, stage_values
from servers import FakeServer

TINY = [
    "+stages=2",
    "model.width=16",
    "data.batch_size=32",
    "trainer.progress=false",
    "checkpoint.export=false",
    "placement.fallback=mirrored",
    "trainer.steps=5",
]
# mode=local reads streamed TFRecord files (data.stream=true): each host only its own replica's files
STREAM = [
    "data=tfrecord",
    "data.y=y",
    "data.stream=true",
    "data.classes={label: 2}",
    "data.shuffle_buffer=24",
    "data.features={x: 'float32[8]', y: int64}",
    "data.val_fraction=0.2",
]
MODES = {"e2e": ["mode=e2e"], "local-stream": ["mode=local", *STREAM]}


def tf_config(addresses: list[str], index: int) -> str:
    return json.dumps({"cluster": {"worker": addresses}, "task": {"type": "worker", "index": index}})


def final(run_dir) -> dict:
    return {k: stage_values(run_dir, f"stage_{k:02d}") for k in range(2)}


def stream_files(root) -> list[list[str]]:
    """5 TFRecord files (4 training, 1 held out for validation) in `root`, and a copy of them per worker in
    which the other worker's training files are damaged (record 1 has no y; record 0, which chain checks
    before training, is whole): a host that read another's replica's files would stop with a bad record. Each worker's data.path override, then the one process's."""
    from test_streaming import write_shards

    write_shards(root / "files", shards=5, per=40, width=8)
    bad = tf.train.Example(
        features=tf.train.Features(feature={"x": tf.train.Feature(float_list=tf.train.FloatList(value=[0.5] * 8))})
    ).SerializeToString()
    for w in range(2):
        shutil.copytree(root / "files", root / f"files{w}")
        for j in range(4):  # replica j % 2 reads training file j (one replica per worker here)
            if j % 2 != w:
                path = str(root / f"files{w}" / f"part-{j:03d}.tfrecord")
                records = [r.numpy() for r in tf.data.TFRecordDataset(path)]
                with tf.io.TFRecordWriter(path) as out:
                    for r in [records[0], bad, *records[2:]]:
                        out.write(r)
    return [[f"data.path={root}/{d}/*.tfrecord"] for d in ("files0", "files1", "files")]


@pytest.mark.parametrize("mode", [pytest.param(m, marks=EXTENDED if m == "local-stream" else ()) for m in MODES])
def test_two_workers_train_like_one_process_mirrored_over_two_replicas(tmp_path, mode):
    addresses = free_addresses(2)
    files = stream_files(tmp_path) if "data.stream=true" in MODES[mode] else [[], [], []]
    args = [sys.executable, "-m", "chain", *TINY, *MODES[mode]]
    procs = [
        subprocess.Popen(
            [*args, *files[i], f"hydra.run.dir={tmp_path / f'w{i}'}"],
            cwd=tmp_path,
            text=True,
            env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", TF_CONFIG=tf_config(addresses, i)),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        for i in range(2)
    ]
    try:
        outs = [p.communicate(timeout=240) for p in procs]
    finally:
        for p in procs:
            p.kill()
    for p, (_out, err) in zip(procs, outs):
        assert p.returncode == 0, err[-3000:]
    assert f"this is worker 1 of 2 ({addresses[1]})" in outs[1][0]
    r = run_cli(tmp_path, *TINY, *MODES[mode], *files[2], f"hydra.run.dir={tmp_path / 'one'}")
    assert r.returncode == 0, r.stderr

    w0, w1, one = final(tmp_path / "w0"), final(tmp_path / "w1"), final(tmp_path / "one")
    for k in range(2):
        assert_values_alike(w0[k], w1[k])  # the replicas stay identical
        assert_values_alike(w0[k], one[k], rtol=1e-6)
    summaries = [read_summary(tmp_path / f"w{i}") for i in range(2)]
    assert summaries[0]["replica_devices"] == [f"/job:worker/replica:0/task:{t}/device:CPU:0" for t in range(2)]
    # each worker computed on its half of every batch, so equal replicas prove the all-reduce
    assert summaries[0]["per_replica_batch_size"] == summaries[1]["per_replica_batch_size"] == 16
    assert summaries[0]["loss_last"] == summaries[1]["loss_last"]
    assert summaries[0]["loss_last"] == pytest.approx(read_summary(tmp_path / "one")["loss_last"], rel=1e-5)


@pytest.mark.parametrize(  # the suite's time: a killed host closes its connections, test_cluster's workers too
    "how", [pytest.param(signal.SIGKILL, marks=EXTENDED), signal.SIGSTOP], ids=["killed", "stopped"]
)
def test_a_lost_host_stops_the_other_with_one_line(tmp_path, how):
    addresses = free_addresses(2)
    args = [
        sys.executable,
        "-m",
        "chain",
        *TINY[:-1],
        "mode=local",
        "trainer.steps=100000",
        "checkpoint.every=0",
        "cluster.lost_after_s=3",
    ]
    env = {k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"}  # as a user runs it
    procs = [
        subprocess.Popen(
            [*args, f"hydra.run.dir={tmp_path / f'w{i}'}"],
            cwd=tmp_path,
            text=True,
            env=dict(env, TF_CONFIG=tf_config(addresses, i), CHAIN_TEST_ANNOUNCE="1"),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        for i in range(2)
    ]
    try:
        for line in procs[0].stderr:
            if "test-hook: step 3 done" in line:
                break
        os.kill(procs[1].pid, how)
        lost = time.monotonic()
        code = procs[0].wait(timeout=90)  # before reading to the end: a host that hangs never closes stderr
        took = time.monotonic() - lost
        rest = procs[0].stderr.read()
    finally:
        for p in procs:
            if p.poll() is None:
                os.kill(p.pid, signal.SIGCONT)  # a stopped process is killed all the same, but never left stopped
                p.kill()
            p.wait()
    errors = [line for line in rest.splitlines() if line.strip() and not line.startswith("test-hook")]
    assert code == 5 and len(errors) == 1, rest[-3000:]
    assert errors[0].startswith(f"error: cluster worker 1 ({addresses[1]}) is lost"), errors[0]
    assert took < 40, took  # a few multiples of cluster.lost_after_s, not forever


@pytest.mark.parametrize("kind", ["silent", "http"])
def test_a_peer_that_is_not_a_tensorflow_server_fails_naming_it(tmp_path, kind):
    with FakeServer(kind) as server:
        addresses = [free_addresses(1)[0], server.address]
        r = run_cli(tmp_path, *TINY, "cluster.lost_after_s=2", env={"TF_CONFIG": tf_config(addresses, 0)}, timeout=90)
    assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
    assert r.stderr.startswith(f"error: TF_CONFIG's worker 1 ({server.address}) "), r.stderr
    assert ("does not answer within 2 s" if kind == "silent" else "not a TensorFlow server") in r.stderr, r.stderr
    assert not (tmp_path / "outputs").exists()


@pytest.mark.parametrize("fallback", ["virtual", "error"])
def test_a_worker_task_without_the_mirrored_fallback_is_one_line(tmp_path, fallback):
    env = {"TF_CONFIG": tf_config(free_addresses(2), 0)}
    r = run_cli(tmp_path, "+stages=2", f"placement.fallback={fallback}", env=env)
    assert r.returncode == 2 and r.stderr.strip().count("\n") == 0, r.stderr
    assert "TF_CONFIG names this process worker 0 of 2" in r.stderr and "placement.fallback=mirrored" in r.stderr
    assert not os.path.exists(tmp_path / "outputs")


def test_every_workers_gpus_are_replicas_named_by_task():
    from chain.planning.inventory import Inventory
    from chain.planning.planner import assign_multi_worker

    pcfg = chain.compose(["+stages=3", "placement.fallback=mirrored"]).placement
    p = assign_multi_worker(pcfg, 3, ["a:1", "b:2"], 1, Inventory.of(2).gpus)
    assert p.mirrored_devices == tuple(f"/job:worker/replica:0/task:{t}/device:GPU:{i}" for t in (0, 1) for i in (0, 1))
    assert p.local_mirrored_devices == p.mirrored_devices[2:] and p.physical[p.mirrored_devices[2]] == "worker 1 b:2"
    assert p.devices == (None,) * 3 and p.topology == "mirrored"
