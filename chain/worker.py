"""`python -m chain.worker --index I --cluster host:port,host:port,...`: one worker of a cluster.

Starts a TensorFlow server (`tf.distribute.Server`) for task I of the job `worker`, prints
the address it serves, and serves until stopped (SIGTERM or Ctrl-C end it cleanly). Without
--index and --cluster it reads both from `TF_CONFIG` (Kubeflow's TFJob); with a client to end
with (`--client host:port`, or TF_CONFIG's `chief`) it exits when that client's job ends, with
the client's exit code, or after `--wait-s` seconds without a word from it (exit 5, one line):
see `chain.planning.job_end`.

The server listens on every network interface (TensorFlow cannot bind it to one address) and
runs what any client sends it: a warning says so at start; run workers on trusted networks. A
training run then places stages on the workers' devices with `cluster.workers=[...]`
(the same list, in the same order): `/job:worker/replica:0/task:I/device:CPU:0` (or GPU:M).

    python -m chain.worker --index 0 --cluster localhost:2222,localhost:2223 &
    python -m chain.worker --index 1 --cluster localhost:2222,localhost:2223 &
    python -m chain +stages=2 mode=e2e cluster.workers=[localhost:2222,localhost:2223]

`--cpus 0,1` pins the worker to those cores (Linux); `--threads N` gives its executor N
intra-op and N inter-op threads: `--cpus 0 --threads 1` makes a CPU worker run one op at a
time, like one accelerator with one stream (how `scripts/bench_pipeline.py` measures overlap).
`--profile-port P` also starts TensorFlow's profiler server on port P, so a run with
`trainer.profile=[START,STOP]` can trace the worker (the run names the ports in
`cluster.profile_ports`, in task order).
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from typing import Sequence

from chain.cli import fail, import_tensorflow_quietly
from chain.errors import ConfigError, first_line


def parse_cluster(text: str) -> list[str]:
    """`host:port,host:port` -> the list, each checked (one ConfigError line naming the bad entry)."""
    from chain.fields import address

    return [address(f"--cluster[{i}]", a.strip()) for i, a in enumerate(text.split(",")) if a.strip()]


def open_to_network(address: str) -> str:
    """Why a worker's port is open beyond the host its cluster names: TensorFlow's gRPC server
    (2.21, `GrpcServer::Init`) listens on `0.0.0.0:PORT` (every interface, IPv6 too) and no
    option of `tf.distribute.Server` or its `ServerDef` names another address."""
    host, port = address.rsplit(":", 1)
    return (
        f"this worker listens on port {port} of every network interface, not only {host} (TensorFlow's "
        f"server cannot be bound to one address), and runs any computation sent to it, unauthenticated: "
        f"run workers on trusted networks only, or firewall the port"
    )


def free_addresses(n: int) -> list[str]:
    """`n` distinct free loopback addresses (`localhost:PORT`), for workers on this machine."""
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("localhost", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return [f"localhost:{p}" for p in ports]


class LocalCluster:
    """K workers on loopback, each a `python -m chain.worker` process (tests, benchmarks, trying it out).

        with LocalCluster(2, cpus=[0, 1], threads=1) as cluster:
            chain.build(chain.compose([..., cluster.option]))

    Every worker is stopped (SIGTERM, then SIGKILL) when the block ends, however it ends.
    """

    def __init__(self, k: int, cpus: Sequence[int] | None = None, threads: int | None = None, profile: bool = False):
        found = free_addresses(2 * k if profile else k)  # one call: the ports are distinct
        self.addresses = found[:k]
        self.profile_ports = [int(a.rsplit(":", 1)[1]) for a in found[k:]]  # profile=True: each worker's profiler
        self.cpus, self.threads = cpus, threads
        self.procs: list[subprocess.Popen | None] = [None] * k

    def __enter__(self) -> "LocalCluster":
        try:
            for i in range(len(self.addresses)):
                self.start(i)
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    @property
    def option(self) -> str:
        """The override that puts a run on these workers."""
        return f"cluster.workers=[{','.join(self.addresses)}]"

    @property
    def profile_option(self) -> str:
        """The override that names the workers' profiler servers (`profile=True`), for `trainer.profile`."""
        return f"cluster.profile_ports=[{','.join(map(str, self.profile_ports))}]"

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self.procs if p is not None]

    def start(self, i: int) -> None:
        """Start (or restart) worker i and wait until it serves."""
        cmd = [sys.executable, "-m", "chain.worker", "--index", str(i), "--cluster", ",".join(self.addresses)]
        if self.cpus is not None:
            cmd += ["--cpus", str(self.cpus[i])]
        if self.threads is not None:
            cmd += ["--threads", str(self.threads)]
        if self.profile_ports:
            cmd += ["--profile-port", str(self.profile_ports[i])]
        env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL=os.environ.get("TF_CPP_MIN_LOG_LEVEL", "3"))
        p = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        self.procs[i] = p
        line = p.stdout.readline()
        if not line.startswith(f"worker {i} serving"):
            raise RuntimeError(f"worker {i} did not start: {line.strip() or p.wait()}")
        threading.Thread(target=p.stdout.read, daemon=True).start()  # keep its pipe drained

    def kill(self, i: int) -> None:
        """SIGKILL worker i (as a crash would)."""
        self.procs[i].kill()
        self.procs[i].wait()

    def stop(self) -> None:
        for p in self.procs:
            if p is not None and p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in self.procs:
            if p is not None:
                try:
                    p.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()


def main(argv: list[str] | None = None) -> None:
    """Entry point of `python -m chain.worker`."""
    ap = argparse.ArgumentParser(prog="python -m chain.worker", description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--index", type=int, default=None, help="this worker's task index in --cluster (default: TF_CONFIG's)"
    )
    ap.add_argument(
        "--cluster",
        default=None,
        help="every worker's host:port, comma-separated, in task order (default: TF_CONFIG's)",
    )
    ap.add_argument(
        "--client",
        default=None,
        help="host:port of the client this worker ends with (default: TF_CONFIG's chief, if any; "
        "none: serve until stopped)",
    )
    ap.add_argument(
        "--wait-s",
        type=float,
        default=60.0,
        help="with a client: end after this many seconds without a word from it (default 60)",
    )
    ap.add_argument("--threads", type=int, default=None, help="intra-op and inter-op threads (default: TensorFlow's)")
    ap.add_argument("--cpus", default=None, help="pin to these cores, e.g. 0 or 0,1 (Linux)")
    ap.add_argument(
        "--profile-port",
        type=int,
        default=None,
        help="also serve TensorFlow's profiler on this port (for trainer.profile)",
    )
    a = ap.parse_args(argv)
    try:
        workers, index, client = _cluster(a)
        if a.threads is not None and a.threads < 1:
            raise ConfigError(f"--threads={a.threads} must be >= 1")
        if a.profile_port is not None and not 0 < a.profile_port < 65536:
            raise ConfigError(f"--profile-port={a.profile_port} must be a port in 1..65535")
        if not a.wait_s > 0:
            raise ConfigError(f"--wait-s={a.wait_s:g} must be > 0")
        if a.cpus is not None:
            try:
                cores = {int(c) for c in a.cpus.split(",")}
                os.sched_setaffinity(0, cores)
            except (ValueError, OSError) as e:
                raise ConfigError(f"--cpus={a.cpus}: cannot pin to those cores ({e})") from None
    except ConfigError as e:
        fail(str(e))
    serve(index, workers, client, a.wait_s, a.threads, a.profile_port)


def _cluster(a: argparse.Namespace) -> tuple[list[str], int, str | None]:
    """The workers, this worker's index and its client's address (None: none) from the flags, or
    from TF_CONFIG when neither --index nor --cluster is given."""
    from chain.fields import address
    from chain.planning.cluster import tf_config

    client = address("--client", a.client) if a.client else None
    if a.index is None and a.cluster is None:
        found = tf_config()
        if found is None:
            raise ConfigError("give --index I --cluster HOST:PORT,... (or set TF_CONFIG, as Kubeflow's TFJob does)")
        if found.kind != "worker":
            what = "no task" if found.kind is None else "the chief's task: the chief runs python -m chain ..."
            raise ConfigError(f"TF_CONFIG has {what}; python -m chain.worker serves a task of type worker")
        return list(found.workers), found.index, client or found.chief
    if a.index is None or a.cluster is None:
        raise ConfigError("give both --index and --cluster, or neither (TF_CONFIG's)")
    workers = parse_cluster(a.cluster)
    if not 0 <= a.index < len(workers):
        raise ConfigError(f"--index={a.index}: the cluster has {len(workers)} workers (0..{len(workers) - 1})")
    return workers, a.index, client


def serve(
    index: int,
    workers: Sequence[str],
    client: str | None,
    wait_s: float,
    threads: int | None = None,
    profile_port: int | None = None,
) -> None:
    """Serve as worker `index` of `workers` until stopped (SIGTERM, Ctrl-C), or, with a `client`,
    until that client ends the job (exit with its code) or is silent for `wait_s` seconds (exit 5).
    Never returns."""
    import_tensorflow_quietly()
    import tensorflow as tf

    from chain.planning import job_end

    config = None
    if threads is not None:
        tf.config.threading.set_intra_op_parallelism_threads(threads)
        tf.config.threading.set_inter_op_parallelism_threads(threads)
        config = tf.compat.v1.ConfigProto(intra_op_parallelism_threads=threads, inter_op_parallelism_threads=threads)
    try:
        server = tf.distribute.Server(
            tf.train.ClusterSpec({"worker": list(workers)}),
            job_name="worker",
            task_index=index,
            config=config,
            start=True,
        )
    except (tf.errors.OpError, ValueError, RuntimeError) as e:
        fail(f"worker {index} cannot serve {workers[index]}: {first_line(e, typed=False)}")
    if profile_port is not None:
        try:
            tf.profiler.experimental.server.start(profile_port)
        except (tf.errors.OpError, ValueError, RuntimeError) as e:
            fail(f"worker {index} cannot serve its profiler on port {profile_port}: {first_line(e, typed=False)}")
    ended: list[int] = []
    signal.signal(signal.SIGTERM, lambda *_: ended.append(0))
    print(f"worker {index} serving {workers[index]} ({server.target})", flush=True)
    print(f"warning: {open_to_network(workers[index])}", file=sys.stderr, flush=True)
    if client is not None:

        def gone(why: str) -> None:
            print(f"error: worker {index} stops: {why}", file=sys.stderr, flush=True)
            ended.append(job_end.EXIT_GONE)

        threading.Thread(target=job_end.watch_client, args=(client, wait_s, ended.append, gone), daemon=True).start()
    try:
        while not ended:  # the server runs in its own threads; this thread only waits for the end
            time.sleep(0.2)
    except KeyboardInterrupt:
        ended.append(0)
    print(f"worker {index} stopped", flush=True)
    os._exit(ended[0])  # the server's threads do not join; nothing is left to save


if __name__ == "__main__":
    main()
