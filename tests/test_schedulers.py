"""Workers under a scheduler: a killed client leaves no worker after the bounded wait; a TFJob chief that
fails ends its workers with its exit code; workers end with their client's code (the end-of-job
protocol in-process); Slurm's host lists, tasks and GPUs;
TF_CONFIG's tasks (a chief, evaluator/ps refused, the data-parallel form kept). The helpers start the
processes of a simulated scheduler; tests/test_doc_examples.py runs docs/cluster.md's TFJob manifest
and sbatch script with them (three processes each, trained like the local run). Every process a test
starts is checked gone at its end."""

from __future__ import annotations

import dataclasses
import json
import os
import socket
import subprocess
import sys
import threading
import time

import pytest

from chain.errors import ConfigError
from chain.planning import cluster, job_end, slurm
from chain.worker import free_addresses
from conftest import stage_values

# appended to a page's command (the last value of a key wins): a few steps of a tiny model
TINY = ["model.width=16", "data.batch_size=32", "trainer.steps=3", "trainer.progress=false", "checkpoint.export=false"]


def final(run_dir) -> dict:
    return {k: stage_values(run_dir, f"stage_{k:02d}") for k in range(2)}


def start(cwd, args: list[str], env: dict) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", *args],
        cwd=cwd,
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", **env),
    )


def finish(procs: list[subprocess.Popen], timeout: float = 240) -> list[tuple[str, str]]:
    """Every process's output once all have ended on their own (killed, and the test failed, if not)."""
    try:
        return [p.communicate(timeout=timeout) for p in procs]
    finally:
        left = [p for p in procs if p.poll() is None]
        for p in left:
            p.kill()
            p.wait()
        assert not left, f"still running: {[p.args for p in left]}"


def consecutive_ports(n: int) -> int:
    """A port P with P..P+n-1 free on loopback (Slurm's tasks on one node take port_base + their rank)."""
    for _ in range(50):
        base = int(free_addresses(1)[0].rsplit(":", 1)[1])
        socks = []
        try:
            for p in range(base, base + n):
                s = socket.socket()
                socks.append(s)
                s.bind(("", p))
            return base
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
    raise AssertionError("no free ports in a row")


CLIENT = (
    "import sys, time; from chain.planning.job_end import JobEnd; JobEnd(sys.argv[1], 'test').start(); "
    "print('listening', flush=True); time.sleep(600)"
)


def test_a_killed_client_leaves_no_worker_after_the_bounded_wait(tmp_path):
    client, worker = free_addresses(2)
    c = subprocess.Popen([sys.executable, "-c", CLIENT, client], stdout=subprocess.PIPE, text=True)
    w = start(tmp_path, ["chain.worker", "--index", "0", "--cluster", worker, "--client", client, "--wait-s", "2"], {})
    try:
        assert os.read(c.stdout.fileno(), 64).startswith(b"listening")  # unbuffered: one reader of its pipe
        assert os.read(w.stdout.fileno(), 200).startswith(b"worker 0 serving")
        time.sleep(1.5)  # connected and told it is alive (a second's beat), beyond the first wait
        c.kill()
        killed = time.monotonic()
        code = w.wait(timeout=30)
        took = time.monotonic() - killed
    finally:
        for p in (c, w):
            if p.poll() is None:
                p.kill()
            p.wait()
    errors = [line for line in w.stderr.read().splitlines() if not line.startswith("warning:")]
    assert code == job_end.EXIT_GONE and errors == [
        f"error: worker 0 stops: no word from its client {client} for 2 s (cluster.wait_s, --wait-s)"
    ], errors
    assert 2 - job_end.BEAT_S <= took < 10, took  # counted from the client's last word (a beat a second)


def test_a_chief_that_fails_ends_its_workers_with_its_exit_code(tmp_path):
    chief, *workers = free_addresses(3)

    def tf_config(kind: str, index: int) -> dict:
        return {
            "TF_CONFIG": json.dumps(
                {"cluster": {"chief": [chief], "worker": workers}, "task": {"type": kind, "index": index}}
            )
        }

    w = start(tmp_path, ["chain.worker"], tf_config("worker", 0))  # worker 1 never starts
    try:
        assert os.read(w.stdout.fileno(), 200).startswith(b"worker 0 serving")
    except BaseException:
        w.kill()
        w.wait()
        raise
    c = start(
        tmp_path,
        ["chain", *TINY, "+stages=2", "mode=e2e", "cluster.wait_s=4", f"hydra.run.dir={tmp_path / 'run'}"],
        tf_config("chief", 0),
    )
    (_, chief_err), (worker_out, _) = finish([c, w], timeout=120)
    assert c.returncode == 2 and chief_err.count("\n") == 1 and f"{workers[1]} is not reachable" in chief_err, chief_err
    assert w.returncode == 2 and worker_out.splitlines()[-1] == "worker 0 stopped", worker_out  # the chief's code


def test_workers_end_with_their_clients_code_and_one_that_never_came_is_waited_for_a_bounded_time():
    ended: dict[str, object] = {}

    def watch(name: str, address: str, wait_s: float) -> threading.Thread:
        t = threading.Thread(
            target=job_end.watch_client,
            daemon=True,
            args=(address, wait_s, lambda code: ended.setdefault(name, code), lambda why: ended.setdefault(name, why)),
        )
        t.start()
        return t

    address, nobody = free_addresses(2)
    ending = job_end.JobEnd(address, "test")
    ending.start()
    watchers = [watch("a", address, 30), watch("b", address, 30), watch("none", nobody, 1)]
    deadline = time.monotonic() + 10
    while len(ending.conns) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    ending.end(3)  # e.g. the client stopped on a non-finite loss: its workers end with its code
    for t in watchers:
        t.join(timeout=10)
    assert ended == {"a": 3, "b": 3, "none": f"no word from its client {nobody} for 1 s (cluster.wait_s, --wait-s)"}
    with pytest.raises(ConfigError, match=r"^the client cannot listen on .* \(TF_CONFIG's chief\)"):
        busy = socket.socket()
        busy.bind(("", 0))
        busy.listen(1)
        try:
            job_end.JobEnd(f"localhost:{busy.getsockname()[1]}", "TF_CONFIG's chief")
        finally:
            busy.close()


def test_slurm_host_lists_tasks_and_gpus():
    assert slurm.hostnames("localhost") == ["localhost"]
    assert slurm.hostnames("node[01-03]") == ["node01", "node02", "node03"]
    assert slurm.hostnames("a[1,3-4]b,gpu7") == ["a1b", "a3b", "a4b", "gpu7"]
    assert slurm.tasks_per_node("2(x3),1") == [2, 2, 2, 1]
    env = {
        "SLURM_PROCID": "3",
        "SLURM_NTASKS": "4",
        "SLURM_STEP_NODELIST": "n[1-2]",
        "SLURM_STEP_TASKS_PER_NODE": "2(x2)",
        "SLURM_GPUS_PER_TASK": "2",
    }
    job = slurm.job(env, 9000)
    assert job.addresses == ("n1:9000", "n1:9001", "n2:9000", "n2:9001") and job.task == 3
    assert job.client == "n1:9000" and job.workers == ("n1:9001", "n2:9000", "n2:9001")
    assert job.visible_gpus == "2,3"  # the second task of its node: the node's GPUs 2 and 3
    assert slurm.job(dict(env, CUDA_VISIBLE_DEVICES="5,6"), 9000).visible_gpus is None  # Slurm bound them already
    with pytest.raises(ConfigError, match="^cluster.launcher=slurm needs SLURM_PROCID, which srun sets"):
        slurm.job({"SLURM_NTASKS": "3"}, 9000)
    with pytest.raises(ConfigError, match=r"^SLURM_STEP_NODELIST='n\[a-b\]': 'a-b' is not"):
        slurm.job(dict(env, SLURM_STEP_NODELIST="n[a-b]"), 9000)


def tf_config(kind: str | None, index: int = 0, chief: bool = True) -> str:
    spec = {"worker": ["w0:1", "w1:1"], **({"chief": ["c:1"]} if chief else {})}
    return json.dumps({"cluster": spec, **({"task": {"type": kind, "index": index}} if kind else {})})


def test_tf_config_tasks(monkeypatch, capsys):
    from chain.config.schema import ClusterSettings
    from chain.worker import main

    settings = ClusterSettings(
        workers=None,
        lost_after_s=5,
        profile_ports=None,
        launcher="none",
        port_base=8888,
        wait_s=60,
        on_lost="stop",
        on_lost_wait_s=60,
    )
    monkeypatch.setenv("TF_CONFIG", tf_config("chief"))
    assert cluster.workers(settings) == ["w0:1", "w1:1"] and cluster.client_address(settings)[0] == "c:1"
    assert cluster.task() is None
    for kind in ("evaluator", "ps"):
        monkeypatch.setenv("TF_CONFIG", tf_config(kind))
        with pytest.raises(ConfigError, match=f"^TF_CONFIG's task is .*: chain has no {kind} tasks"):
            cluster.workers(settings)
    monkeypatch.setenv("TF_CONFIG", tf_config("worker", 1))
    assert cluster.workers(settings) is None and cluster.client_address(settings) is None
    with pytest.raises(ConfigError, match="^TF_CONFIG names this process worker 1 of a job whose chief"):
        cluster.task()
    monkeypatch.setenv("TF_CONFIG", tf_config("worker", 1, chief=False))
    assert cluster.task() == (["w0:1", "w1:1"], 1)  # the data-parallel form stays
    for key, value in {"SLURM_PROCID": "1", "SLURM_NTASKS": "3", "SLURM_STEP_NODELIST": "localhost"}.items():
        monkeypatch.setenv(key, value)
    slurm_settings = dataclasses.replace(settings, launcher="slurm")
    with pytest.raises(ConfigError, match="^cluster.launcher=slurm: this is task 1 of the step, a worker"):
        cluster.workers(slurm_settings)  # only the command line serves a worker's task
    monkeypatch.setenv("SLURM_PROCID", "0")
    assert cluster.workers(slurm_settings) == ["localhost:8889", "localhost:8890"]
    assert cluster.client_address(slurm_settings)[0] == "localhost:8888"
    for kind, said in [("chief", "TF_CONFIG has the chief's task"), ("ps", "chain has no ps tasks")]:
        monkeypatch.setenv("TF_CONFIG", tf_config(kind))
        with pytest.raises(SystemExit) as e:
            main([])
        err = capsys.readouterr().err
        assert e.value.code == 2 and err.count("\n") == 1 and said in err, err
