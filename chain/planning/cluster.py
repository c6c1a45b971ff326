"""Cluster workers: which ones (`cluster.workers`, or `TF_CONFIG`), whether they answer, connecting
the client to them, their devices, and a watchdog that stops the run when one is lost.

With workers, this process is the *client*: `tf.config.experimental_connect_to_cluster`
makes every worker's devices (`/job:worker/replica:0/task:I/device:CPU:0`, `GPU:M`) usable
from its `tf.function`s, and TensorFlow moves tensors between them itself. The client reads
the data, writes checkpoints and logs: the run directory stays on one machine.
"""

from __future__ import annotations

import json
import os
import re
import socket
import sys
import threading
import time
from dataclasses import dataclass
from typing import Callable, Sequence

from chain.config.schema import ClusterSettings
from chain.errors import ConfigError, DeviceError, WorkerLost, first_line
from chain.planning import slurm
from chain.planning.devices import WORKER_JOB, canonical

EXIT_LOST = WorkerLost.exit_code


@dataclass(frozen=True)
class TfConfig:
    """What `TF_CONFIG` says: the `worker` job's addresses, the `chief`'s (None: no chief), and this
    process's task (`kind` None: no task)."""

    workers: tuple[str, ...]
    chief: str | None = None
    kind: str | None = None
    index: int = 0


EXAMPLE = (
    '{"cluster": {"chief": ["host:2222"], "worker": ["host:2223", "host:2224"]}, '
    '"task": {"type": "worker", "index": 0}}'
)


def tf_config() -> TfConfig | None:
    """`TF_CONFIG` read and checked (one ConfigError line), or None when it is not set. Its task may be
    the `chief` (the client: it runs the program) or a `worker` (it serves, or trains data parallel);
    an `evaluator` or `ps` task is refused: chain has neither."""
    raw = os.environ.get("TF_CONFIG")
    if not raw:
        return None
    try:
        config = json.loads(raw)
        found = tuple(str(a) for a in config["cluster"][WORKER_JOB])
        chiefs = [str(a) for a in config["cluster"].get("chief") or []]
    except (ValueError, KeyError, TypeError, AttributeError):
        raise ConfigError(f"TF_CONFIG is set but holds no cluster.worker list, e.g. {EXAMPLE}") from None
    if len(chiefs) > 1:
        raise ConfigError(f"TF_CONFIG's cluster has {len(chiefs)} chiefs ({', '.join(chiefs)}); a job has one")
    chief = chiefs[0] if chiefs else None
    t = config.get("task")
    if not t:
        return TfConfig(found, chief)
    kind = t.get("type") if isinstance(t, dict) else None
    if kind in ("evaluator", "ps"):
        raise ConfigError(
            f"TF_CONFIG's task is {json.dumps(t)}: chain has no {kind} tasks (its client is the chief, "
            f"its stages on the workers); run this task as a worker, or leave it out of the job"
        )
    size = {WORKER_JOB: len(found), "chief": len(chiefs)}.get(kind, 0)
    if not isinstance(t.get("index") if kind else None, int) or not 0 <= t["index"] < size:
        raise ConfigError(
            f'TF_CONFIG\'s task must be the chief or a worker of its cluster, {{"type": "worker", '
            f'"index": I}} with 0 <= I < {len(found)}, or {{"type": "chief", "index": 0}} '
            f"when its cluster has a chief; got {json.dumps(t)}"
        )
    return TfConfig(found, chief, kind, t["index"])


def workers(settings: ClusterSettings) -> list[str] | None:
    """The workers' addresses in task order: `cluster.workers`, else the Slurm step's tasks after the
    first (`cluster.launcher=slurm`), else `TF_CONFIG`'s `worker` job when this process is its client
    (no task, or the chief), else None."""
    if settings.workers:
        return list(settings.workers)
    if settings.launcher == "slurm":
        job = slurm.job(os.environ, settings.port_base)
        if job.task > 0:  # the command line serves these tasks as workers before it gets here
            raise ConfigError(
                f"cluster.launcher=slurm: this is task {job.task} of the step, a worker; only task 0 is "
                f"the client: start every task with srun python -m chain cluster.launcher=slurm ..."
            )
        return list(job.workers)
    found = tf_config()
    if found is None or found.kind == WORKER_JOB:
        return None  # no TF_CONFIG, or one that makes this process a worker (see `task`)
    return list(found.workers)


def client_address(settings: ClusterSettings) -> tuple[str, str] | None:
    """Where this process, as a scheduler's client, tells its workers that the job ended
    (`chain.planning.job_end`), and the setting that names it: the Slurm step's task 0, or
    TF_CONFIG's chief when this process is the chief. None otherwise (its workers serve on)."""
    if settings.launcher == "slurm" and not settings.workers:
        return slurm.job(os.environ, settings.port_base).client, "SLURM_STEP_NODELIST, cluster.port_base"
    found = tf_config()
    if found is not None and found.kind == "chief" and not settings.workers:
        return found.chief, "TF_CONFIG's chief"
    return None


def task() -> tuple[list[str], int] | None:
    """(TF_CONFIG's workers, this process's index) when TF_CONFIG names this process a worker
    (`"task": {"type": "worker", "index": I}`) of a cluster without a chief: the multi-worker
    mirrored form, in which every host runs the same command. None otherwise."""
    found = tf_config()
    if found is None or found.kind != WORKER_JOB:
        return None
    if found.chief is not None:
        raise ConfigError(
            f"TF_CONFIG names this process worker {found.index} of a job whose chief "
            f"({found.chief}) runs the program: a worker serves the chief's stages with "
            f"python -m chain.worker (it reads TF_CONFIG)"
        )
    return list(found.workers), found.index


_multi_worker: list = []  # the process's one MultiWorkerMirroredStrategy


def multi_worker_tf_strategy():
    """The process's MultiWorkerMirroredStrategy (from TF_CONFIG), created on first use. Its first
    use must come before TensorFlow's runtime starts: it configures the runtime's collectives
    and serves this worker's address."""
    import logging

    import tensorflow as tf

    if not _multi_worker:
        # Its INFO lines (the devices, every all-reduce it traces) repeat what the placement table says.
        logging.getLogger("tensorflow").setLevel(logging.WARNING)
        _multi_worker.append(tf.distribute.MultiWorkerMirroredStrategy())
    return _multi_worker[0]


# What a TensorFlow server (gRPC: HTTP/2) answers first to a client's connection preface is its SETTINGS
# frame: a 9-byte frame header whose fourth byte is the frame type, 4. Its transport threads answer
# it even while the server computes, so an answer proves the process is alive and serving.
_HTTP2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"  # + empty SETTINGS
_SETTINGS = 4


@dataclass(frozen=True)
class Silence:
    """Why an address does not answer as a TensorFlow server: `why` in words, and whether it
    accepted the connection (something listens there: a wrong or a stopped server)."""

    why: str
    connected: bool


def silence(address: str, timeout: float) -> Silence | None:
    """Why `address` does not answer as a TensorFlow server within `timeout` seconds (None: it does).

    A port that accepts connections is not enough: the kernel accepts them for a stopped
    (SIGSTOP) or wedged process too, and for any other server. So this opens a connection,
    speaks the first words of gRPC's HTTP/2 and waits for the server's own."""
    host, port = address.rsplit(":", 1)
    try:
        conn = socket.create_connection((host, int(port)), timeout=timeout)
    except OSError as e:
        return Silence(e.strerror or str(e) or type(e).__name__, connected=False)
    with conn:
        try:
            conn.settimeout(timeout)
            conn.sendall(_HTTP2_PREFACE)
            head = b""
            while len(head) < 4:  # up to the frame type
                part = conn.recv(9 - len(head))
                if not part:
                    break
                head += part
        except socket.timeout:
            return Silence("accepts connections but does not answer", connected=True)
        except OSError as e:
            return Silence(f"closes connections ({e.strerror or e})", connected=True)
    if len(head) > 3 and head[3] == _SETTINGS:
        return None
    if not head:
        return Silence("closes connections without answering: not a TensorFlow server", connected=True)
    said = head.decode("ascii", "replace").strip()
    said = "".join(c if c.isprintable() else "?" for c in said)
    return Silence(f"is not a TensorFlow server (it answered {said!r}...)", connected=True)


def _refusal(subject: str, found: Silence, timeout: float, start: str | None) -> str:
    """One line: `subject` (a worker's address) does not answer as a TensorFlow server, and how one is started."""
    how = f"; a worker is started with: {start}" if start else ""
    if not found.connected:
        return f"{subject} is not reachable ({found.why}); start it with: {start}"
    if found.why.startswith("accepts"):
        return (
            f"{subject} {found.why} within {timeout:g} s (cluster.lost_after_s): not a TensorFlow server, "
            f"or a stopped one{how}"
        )
    return f"{subject} {found.why}{how}"


def check_reachable(addresses: Sequence[str], timeout: float, wait: float = 0.0) -> None:
    """A DeviceError naming the first worker that does not answer as a TensorFlow server within
    `timeout` seconds, and how to start it (connecting to one that does not would wait forever).
    `wait`: how long a worker that does not listen yet is waited for (a scheduler starts them with
    the client)."""
    deadline = time.monotonic() + wait
    for i, a in enumerate(addresses):
        found = silence(a, timeout)
        while found and not found.connected and time.monotonic() < deadline:
            time.sleep(0.5)
            found = silence(a, timeout)
        if found:
            start = f"python -m chain.worker --index {i} --cluster {','.join(addresses)}"
            raise DeviceError(_refusal(f"cluster.workers[{i}]={a}", found, timeout, start))


def check_peers(addresses: Sequence[str], task: int, timeout: float) -> None:
    """A DeviceError naming the first of TF_CONFIG's other workers where something that is not a
    TensorFlow server listens (TensorFlow would wait for it forever). A peer that does not accept
    connections yet is one that has not started: TensorFlow waits for it."""
    for i, a in enumerate(addresses):
        found = silence(a, timeout) if i != task else None
        if found and found.connected:
            raise DeviceError(_refusal(f"TF_CONFIG's worker {i} ({a})", found, timeout, None))


_connected: list[tuple[str, ...]] = []  # the cluster this process is connected to


def connect(addresses: Sequence[str]) -> None:
    """Make the workers' devices usable from this process (before any tensor exists). Once per
    process: connecting again would reset the runtime under the runs already built."""
    import tensorflow as tf

    key = tuple(addresses)
    if _connected:
        if _connected[0] != key:
            raise DeviceError(
                f"this process is connected to the cluster {', '.join(_connected[0])}; a run on "
                f"{', '.join(key)} needs a new process"
            )
        return
    try:
        tf.config.experimental_connect_to_cluster(tf.train.ClusterSpec({WORKER_JOB: list(key)}))
        tf.config.list_logical_devices()  # the runtime starts here and asks every worker for its status
    except tf.errors.OpError as e:  # a gRPC server that is not a TensorFlow worker (a profiler server, ...)
        raise DeviceError(_not_a_worker(key, e)) from None
    _connected.append(key)


def _not_a_worker(addresses: Sequence[str], e: Exception) -> str:
    """One line for a connection that a server refused: the worker TensorFlow's error names, if any."""
    task = re.search(rf"/job:{WORKER_JOB}/replica:0/task:(\d+)", str(e))
    if task is None or int(task.group(1)) >= len(addresses):
        return f"cannot connect to the cluster workers {', '.join(addresses)}: {first_line(e, typed=False)}"
    i = int(task.group(1))
    return (
        f"cluster.workers[{i}]={addresses[i]} is not a TensorFlow worker (it refused TensorFlow's worker "
        f"service: {type(e).__name__}); a worker is started with: python -m chain.worker --index {i} "
        f"--cluster {','.join(addresses)}"
    )


def remote_devices(n_workers: int) -> list[list[str]]:
    """Each worker's devices (canonical names), GPUs first, then CPUs."""
    import tensorflow as tf

    tasks: list[list[str]] = [[] for _ in range(n_workers)]
    for d in tf.config.list_logical_devices():
        spec = tf.DeviceSpec.from_string(d.name)
        if spec.job == WORKER_JOB and spec.task is not None and spec.task < n_workers:
            tasks[spec.task].append(canonical(d.name))
    return [sorted(t, key=lambda name: ("CPU" in name, name)) for t in tasks]


def _lost_line(i: int, address: str, found: Silence, seconds: float) -> str:
    """`cluster worker I (ADDRESS) is lost: ...` for a worker silent for `seconds` (0: just now)."""
    how = "unreachable" if not found.connected else "no answer"
    during = f" for {seconds:g} s" if seconds else ""
    return f"cluster worker {i} ({address}) is lost: {how}{during} ({found.why})"


def find_lost(addresses: Sequence[str], state: str) -> WorkerLost | None:
    """The error naming the first worker that does not answer now (within a second), or None."""
    for i, a in enumerate(addresses):
        found = silence(a, timeout=1.0)
        if found:
            return WorkerLost(f"{_lost_line(i, a, found, 0)}; {state}")
    return None


def lost(addresses: Sequence[str], state: str, wait: float = 0.0) -> WorkerLost:
    """The error for a run whose step failed because a worker went away: names the first that
    does not answer (within `wait` seconds), or all of them when each answers again."""
    deadline = time.monotonic() + wait
    while True:
        found = find_lost(addresses, state)
        if found:
            return found
        if time.monotonic() >= deadline:
            return WorkerLost(f"a cluster worker stopped the step (workers: {', '.join(addresses)}); {state}")
        time.sleep(0.2)


class Watchdog(threading.Thread):
    """Asks every worker's server for an answer (`silence`) twice a second; one that does not answer
    for `lost_after` seconds (killed, its host gone, stopped or wedged) ends the process at once with
    one line naming it (a step waiting on it would wait for minutes, or forever): exit code 5.
    `state()` says what is left (the last complete checkpoint). `skip`: this process's own task
    (a multi-worker mirrored run watches its peers). `stop()` ends the watch (peers that end their
    own runs may go)."""

    def __init__(self, addresses: Sequence[str], lost_after: float, state: Callable[[], str], skip: int | None = None):
        super().__init__(daemon=True, name="chain-watchdog")
        self.addresses, self.lost_after, self.state, self.skip = list(addresses), lost_after, state, skip
        self._stopped = threading.Event()

    def stop(self) -> None:
        """Stop watching (from any thread); a verdict not yet printed is dropped."""
        self._stopped.set()

    def run(self) -> None:
        last_ok = [time.monotonic()] * len(self.addresses)
        while not self._stopped.is_set():
            for i, a in enumerate(self.addresses):
                if i == self.skip:
                    continue
                found = silence(a, timeout=self.lost_after)
                now = time.monotonic()
                if found is None:
                    last_ok[i] = now
                elif now - last_ok[i] >= self.lost_after and not self._stopped.is_set():
                    print(
                        f"error: {_lost_line(i, a, found, self.lost_after)}; {self.state()}",
                        file=sys.stderr,
                        flush=True,
                    )
                    os._exit(EXIT_LOST)
            self._stopped.wait(0.5)
