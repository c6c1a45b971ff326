"""Workers that end with the job. Under a scheduler the client has an address of its own (TF_CONFIG's
`chief`, task 0 of `cluster.launcher=slurm`) that TensorFlow does not use: the client listens there,
every worker connects to it, and the client says `alive` every second and `end CODE` when the job
ends (done: 0; an error or Ctrl-C: its exit code). A worker exits with that code, so a TFJob or a
Slurm step completes (or fails) with its client. A worker that hears nothing from its client for
`wait_s` seconds (never came, killed, its host gone) ends with one line: a restarted client that
comes back within that time keeps it. Plain sockets, one line per message; no TensorFlow."""

from __future__ import annotations

import socket
import threading
import time
from typing import Callable

from chain.errors import ConfigError

BEAT_S = 1.0  # how often the client says it is alive
EXIT_GONE = 5  # as a lost worker stops a client (chain.errors.WorkerLost)


class JobEnd(threading.Thread):
    """The client's side: listens on the port of `address` (every interface: a scheduler's host name
    may not name this host's own address) and keeps every worker that connects told."""

    def __init__(self, address: str, key: str):
        super().__init__(daemon=True, name="chain-job-end")
        port = int(address.rsplit(":", 1)[1])
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            self.sock.bind(("", port))
        except OSError as e:
            self.sock.close()
            raise ConfigError(
                f"the client cannot listen on {address} ({key}), where its workers look for it: {e.strerror or e}"
            ) from None
        self.sock.listen(64)
        self.sock.settimeout(BEAT_S)
        self.conns: list[socket.socket] = []
        self.lock = threading.Lock()
        self.closed = False

    def run(self) -> None:
        last = 0.0
        while not self.closed:
            try:
                conn, _ = self.sock.accept()
                with self.lock:
                    self.conns.append(conn)
            except OSError:  # the second's timeout, or the socket closed by `end`
                pass
            if time.monotonic() - last >= BEAT_S:
                last = time.monotonic()
                self._say(b"alive\n")

    def _say(self, message: bytes) -> None:
        with self.lock:
            for c in list(self.conns):
                try:
                    c.sendall(message)
                except OSError:
                    self.conns.remove(c)  # that worker went away

    def end(self, code: int) -> None:
        """Tell every worker the job ended with `code`, and stop listening."""
        self.closed = True
        self._say(f"end {code}\n".encode())
        with self.lock:
            for c in self.conns:
                c.close()
            self.conns.clear()
        self.sock.close()


def watch_client(address: str, wait_s: float, on_end: Callable[[int], None], on_gone: Callable[[str], None]) -> None:
    """A worker's side, run in a thread of its own: keep a connection to the client at `address`;
    `on_end(code)` when it says the job ended; `on_gone(why)` after `wait_s` seconds without a word
    from it (counted from the start, so a client that never comes ends the worker too)."""
    host, port = address.rsplit(":", 1)
    heard = time.monotonic()
    conn: socket.socket | None = None
    pending = b""
    while True:
        if time.monotonic() - heard > wait_s:
            return on_gone(f"no word from its client {address} for {wait_s:g} s (cluster.wait_s, --wait-s)")
        if conn is None:
            try:
                conn = socket.create_connection((host, int(port)), timeout=BEAT_S)
                pending = b""
            except OSError:
                time.sleep(0.5)
                continue
        try:
            data = conn.recv(4096)
        except socket.timeout:
            continue
        except OSError:
            data = b""
        if not data:  # the client closed the connection without a word: killed, or restarting
            conn.close()
            conn = None
            time.sleep(0.5)
            continue
        heard = time.monotonic()
        pending += data
        *lines, pending = pending.split(b"\n")
        for line in lines:
            if line.startswith(b"end "):
                conn.close()
                return on_end(int(line.split()[1]))
