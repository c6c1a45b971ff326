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
import socket
import sys
import threading
import time
from typing import Callable, Sequence

from chain.errors import ConfigError, DeviceError, WorkerLost
from chain.planning.devices import WORKER_JOB, canonical

EXIT_LOST = WorkerLost.exit_code


def workers(configured: Sequence[str] | None) -> list[str] | None:
    """The workers' addresses in task order: `cluster.workers`, else `TF_CONFIG`'s `worker` job, else None."""
    if configured:
        return list(configured)
    found = _tf_config()
    if found is None or found[1] is not None:
        return None  # no TF_CONFIG, or one that makes this process a worker (see `task`)
    return found[0]


def task() -> tuple[list[str], int] | None:
    """(TF_CONFIG's workers, this process's index) when TF_CONFIG names this process a worker
    (`"task": {"type": "worker", "index": I}`): the multi-worker mirrored form, in which every
    host runs the same command. None otherwise."""
    found = _tf_config()
    if found is None or found[1] is None:
        return None
    return found[0], found[1]


def _tf_config() -> tuple[list[str], int | None] | None:
    """TF_CONFIG's worker addresses and task index (None: no task), or None without TF_CONFIG."""
    raw = os.environ.get("TF_CONFIG")
    if not raw:
        return None
    example = '{"cluster": {"worker": ["host:2222", "host:2223"]}, "task": {"type": "worker", "index": 0}}'
    try:
        config = json.loads(raw)
        found = [str(a) for a in config["cluster"][WORKER_JOB]]
    except (ValueError, KeyError, TypeError):
        raise ConfigError(f"TF_CONFIG is set but holds no cluster.worker list, e.g. {example}") from None
    if not config.get("task"):
        return found, None
    t = config["task"]
    if not isinstance(t, dict) or t.get("type") != WORKER_JOB or not isinstance(t.get("index"), int) \
            or not 0 <= t["index"] < len(found):
        raise ConfigError(f"TF_CONFIG's task must be a worker of its cluster, {{\"type\": \"worker\", \"index\": I}} "
                          f"with 0 <= I < {len(found)}; got {json.dumps(t)}")
    return found, t["index"]


_multi_worker: list = []  # the process's one MultiWorkerMirroredStrategy


def multi_worker_strategy():
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


def unreachable(address: str, timeout: float = 2.0) -> str | None:
    """Why `address` does not accept a connection (None: it does)."""
    host, port = address.rsplit(":", 1)
    try:
        with socket.create_connection((host, int(port)), timeout=timeout):
            return None
    except OSError as e:
        return e.strerror or str(e) or type(e).__name__


def check_reachable(addresses: Sequence[str]) -> None:
    """A DeviceError naming the first worker that does not answer, and how to start it."""
    for i, a in enumerate(addresses):
        why = unreachable(a)
        if why:
            raise DeviceError(f"cluster.workers[{i}]={a} is not reachable ({why}); start it with: python -m chain.worker "
                              f"--index {i} --cluster {','.join(addresses)}")


_connected: list[tuple[str, ...]] = []  # the cluster this process is connected to


def connect(addresses: Sequence[str]) -> None:
    """Make the workers' devices usable from this process (before any tensor exists). Once per
    process: connecting again would reset the runtime under the runs already built."""
    import tensorflow as tf

    key = tuple(addresses)
    if _connected:
        if _connected[0] != key:
            raise DeviceError(f"this process is connected to the cluster {', '.join(_connected[0])}; a run on "
                              f"{', '.join(key)} needs a new process")
        return
    tf.config.experimental_connect_to_cluster(tf.train.ClusterSpec({WORKER_JOB: list(key)}))
    _connected.append(key)


def remote_devices(n_workers: int) -> list[list[str]]:
    """Each worker's devices (canonical names), GPUs first, then CPUs."""
    import tensorflow as tf

    tasks: list[list[str]] = [[] for _ in range(n_workers)]
    for d in tf.config.list_logical_devices():
        spec = tf.DeviceSpec.from_string(d.name)
        if spec.job == WORKER_JOB and spec.task is not None and spec.task < n_workers:
            tasks[spec.task].append(canonical(d.name))
    return [sorted(t, key=lambda name: ("CPU" in name, name)) for t in tasks]


def lost(addresses: Sequence[str], state: str, wait: float = 0.0) -> WorkerLost:
    """The error for a run whose step failed because a worker went away: names the first that
    does not answer (within `wait` seconds), or all of them when each answers again."""
    deadline = time.monotonic() + wait
    while True:
        for i, a in enumerate(addresses):
            why = unreachable(a, timeout=1.0)
            if why:
                return WorkerLost(f"cluster worker {i} ({a}) is lost ({why}); {state}")
        if time.monotonic() >= deadline:
            return WorkerLost(f"a cluster worker stopped the step (workers: {', '.join(addresses)}); {state}")
        time.sleep(0.2)


class Watchdog(threading.Thread):
    """Checks every worker's port twice a second; one unreachable for `lost_after` seconds ends the
    process at once with one line naming it (a step waiting on a dead worker would wait for
    minutes): exit code 5. `state()` says what is left (the last complete checkpoint)."""

    def __init__(self, addresses: Sequence[str], lost_after: float, state: Callable[[], str]):
        super().__init__(daemon=True, name="chain-watchdog")
        self.addresses, self.lost_after, self.state = list(addresses), lost_after, state

    def run(self) -> None:
        last_ok = [time.monotonic()] * len(self.addresses)
        while True:
            for i, a in enumerate(self.addresses):
                why = unreachable(a, timeout=min(1.0, self.lost_after))
                now = time.monotonic()
                if why is None:
                    last_ok[i] = now
                elif now - last_ok[i] >= self.lost_after:
                    print(f"error: cluster worker {i} ({a}) is lost: unreachable for {self.lost_after:g} s ({why}); "
                          f"{self.state()}", file=sys.stderr, flush=True)
                    os._exit(EXIT_LOST)
            time.sleep(0.5)
