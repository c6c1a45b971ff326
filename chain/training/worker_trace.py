"""Tracing cluster workers for exactly the profiled steps, through TensorFlow's profiler service
(`python -m chain.worker --profile-port P`: `tf.profiler.experimental.server.start`).

`tf.profiler.experimental.client.trace` traces for a duration fixed in advance: too short on a
loaded machine (the window's first step compiles the one-step function, seconds under load,
and the trace ended before the steps ran) and idle waiting when too long; it also prints
`Starting to trace for N ms` on stdout from C++. Here the client sends each worker's profiler
the service's own `Profile` request with a session id of its choosing and a long limit
(`LONGEST_MS`), waits until every worker's session is running, and when the window's last step
has ended sends `Terminate` for that session: each worker then writes its trace
(`<logdir>/plugins/profile/<session>/<host>_<port>.xplane.pb`, on the worker's file system) and
answers. The session is known to run when a second, empty request is refused with the
service's "Another profiling session active" (one session per process); the probe asks for
its trace in the answer (`emit_xspace`), so it writes no file.

The two requests (`ProfileRequest`, `TerminateRequest` of the `tensorflow.ProfilerService`, whose
Python classes TensorFlow does not ship) are encoded by `chain.internals.tf_private`, with the
service's method names. The answers are not read: the call's status says whether the trace was
written.
"""

from __future__ import annotations

import os
import time
from typing import Any, Sequence

from chain.errors import ChainError, ConfigError, first_line
from chain.internals.tf_private import ACTIVE, PROFILE, TERMINATE, profile_request, terminate_request

LONGEST_MS = 3_600_000  # a session nobody terminates ends after this (a client that dies cancels its call at once)
ANSWER_S = 10.0  # how long a worker's profiler may take to answer one request
START_S = 60.0  # how long every worker's session may take to start
WRITE_S = 300.0  # how long a worker may take to write its trace after Terminate


def _detail(e: BaseException) -> str:
    """An error of a call in a few words: a gRPC status code and the first line of its details
    (`grpc.FutureTimeoutError`, which has neither: what it means)."""
    if not hasattr(e, "code"):
        return f"no answer in {WRITE_S:.0f} s"
    details = (e.details() or "").strip()
    return f"{e.code().name}: {first_line(RuntimeError(details), typed=False)}" if details else e.code().name


def _refused(e: BaseException) -> bool:
    """Whether a trace request was refused because a session was running."""
    import grpc

    return e.code() == grpc.StatusCode.INTERNAL and ACTIVE in (e.details() or "")


class WorkerTraces:
    """The profilers of a cluster's workers (`addresses`: `host:port` of each, in task order) and one
    trace session on all of them; `keys` name each in messages (`cluster.profile_ports[i]`)."""

    def __init__(self, addresses: Sequence[str], keys: Sequence[str]):
        import grpc  # TensorFlow's own dependency

        self.addresses, self.keys = list(addresses), list(keys)
        self._channels = [grpc.insecure_channel(a) for a in self.addresses]
        self._calls: list[Any] = []
        self.session: str | None = None

    def _probe(self, i: int) -> str | None:
        """An empty trace request to worker i: None when it ran (no session was running), the
        refusal's words when one was, a ConfigError when nothing there serves TensorFlow's profiler."""
        import grpc

        probe = profile_request(f"chain_probe_{os.getpid()}", "", self.addresses[i], 0, emit=True)
        try:
            self._channels[i].unary_unary(PROFILE)(probe, timeout=ANSWER_S)
            return None
        except grpc.RpcError as e:
            if _refused(e):
                return e.details()
            raise ConfigError(
                f"{self.keys[i]}: {self.addresses[i]} does not serve TensorFlow's profiler "
                f"({_detail(e)}); start worker {i} with --profile-port "
                f"{self.addresses[i].rsplit(':', 1)[1]}"
            ) from None

    def check(self) -> None:
        """Every worker's profiler answers and is idle (a ConfigError naming the first that is not)."""
        for i in range(len(self.addresses)):
            if self._probe(i) is not None:
                raise ConfigError(
                    f"{self.keys[i]}: the profiler at {self.addresses[i]} is already tracing "
                    f"(another client's session): trainer.profile needs it idle"
                )

    def start(self, session: str, root: str) -> None:
        """Start a trace session `session` on every worker, writing under `root`, and return once
        each is running (a request refused because the probe held the profiler is sent again)."""
        self.session = session
        self._calls = [self._send(i, root) for i in range(len(self.addresses))]
        deadline = time.monotonic() + START_S
        waiting = set(range(len(self.addresses)))
        while waiting:
            for i in sorted(waiting):
                call = self._calls[i]
                if call.done():  # it ended before its session was seen running: refused, or failed
                    if call.exception() is not None and not _refused(call.exception()):
                        self.stop()
                        raise ChainError(
                            f"the profiler of worker {i} ({self.addresses[i]}) did not trace: "
                            f"{_detail(call.exception())}"
                        )
                    self._calls[i] = self._send(i, root)
                elif self._probe(i) is not None:
                    waiting.discard(i)
            if waiting and time.monotonic() > deadline:
                self.stop()
                raise ChainError(
                    f"the profilers of {', '.join(self.addresses[i] for i in sorted(waiting))} did not "
                    f"start tracing in {START_S:.0f} s"
                )
            if waiting:
                time.sleep(0.01)

    def _send(self, i: int, root: str) -> Any:
        """Worker i's trace request, sent (a gRPC future: it answers when the session ends)."""
        request = profile_request(self.session, root, self.addresses[i], LONGEST_MS)
        return self._channels[i].unary_unary(PROFILE).future(request, timeout=LONGEST_MS / 1000 + WRITE_S)

    def stop(self) -> list[str]:
        """End the session on every worker and wait until each has written its trace; the problems,
        one line per worker that did not write one."""
        import grpc

        problems = []
        for i, call in enumerate(self._calls):
            try:
                self._channels[i].unary_unary(TERMINATE)(terminate_request(self.session), timeout=ANSWER_S)
                call.result(timeout=WRITE_S)
            except (grpc.RpcError, grpc.FutureTimeoutError) as e:
                call.cancel()
                problems.append(f"worker {i} ({self.addresses[i]}) wrote no trace: {_detail(e)}")
        self._calls = []
        return problems

    def close(self) -> None:
        """Close the connections to the profilers."""
        for c in self._channels:
            c.close()
