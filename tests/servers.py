"""Servers that are not TensorFlow servers, on loopback: what a cluster address may wrongly name."""

from __future__ import annotations

import socket
import threading


class FakeServer:
    """A server on loopback that accepts connections and either never answers ("silent") or answers
    as an HTTP/1.1 server does to what it does not understand ("http")."""

    def __init__(self, kind: str):
        self.kind, self.sock, self.conns = kind, socket.socket(), []
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.address = f"127.0.0.1:{self.sock.getsockname()[1]}"
        threading.Thread(target=self.serve, daemon=True).start()

    def serve(self) -> None:
        while True:
            try:
                c, _ = self.sock.accept()
            except OSError:
                return
            self.conns.append(c)  # kept open: a silent server never closes either
            if self.kind == "http":
                c.recv(4096)
                c.sendall(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")

    def __enter__(self) -> "FakeServer":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        self.sock.close()
        for c in self.conns:
            c.close()
