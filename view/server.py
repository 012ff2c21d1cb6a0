"""``ViewServer``: the explorer's app under uvicorn, in the foreground (``hallulog view``) or in
a daemon thread (tests, notebooks)."""

from __future__ import annotations

import logging
import socket
import threading
import time
from collections.abc import Callable

import uvicorn
from fastapi import FastAPI
from hallulog.view.auth import require_token_off_loopback

__all__ = ["ViewServer", "bind"]

log = logging.getLogger(__name__)


def bind(host: str, port: int) -> socket.socket:
    """A listening socket on ``host:port`` (``port`` 0: a free one); "in use" names the flag."""
    family, socktype, proto, _, addr = socket.getaddrinfo(
        host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
    )[0]
    sock = socket.socket(family, socktype, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(addr)
        sock.listen(128)
    except OSError as exc:
        sock.close()
        raise OSError(
            exc.errno, f"hallulog view cannot listen on {host}:{port}: {exc.strerror} (--port)"
        ) from exc
    return sock


class ViewServer:
    """Serve ``app`` on ``host:port``; refuses a host off loopback without a token."""

    def __init__(self, app: FastAPI, host: str = "127.0.0.1", port: int = 0, token=None):
        require_token_off_loopback(host, token)
        self.app, self.host, self.port = app, host, port
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None
        self._sock: socket.socket | None = None

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}/"

    def _prepare(self) -> None:
        self._sock = bind(self.host, self.port)
        self.port = self._sock.getsockname()[1]
        config = uvicorn.Config(
            self.app, log_level="warning", access_log=False, lifespan="off", ws="none"
        )
        self._server = uvicorn.Server(config)

    def serve(self, on_listening: Callable[[str], None] | None = None) -> None:
        """In the foreground until interrupted (Ctrl-C); ``on_listening(url)`` once the socket
        is bound (its port known)."""
        self._prepare()
        assert self._server is not None and self._sock is not None
        if on_listening is not None:
            on_listening(self.url)
        try:
            self._server.run(sockets=[self._sock])
        finally:
            for site in getattr(self.app.state, "sites", {}).values():
                site.close()

    def start(self, timeout_s: float = 10.0) -> ViewServer:
        """In a daemon thread; returns once serving."""
        self._prepare()
        assert self._server is not None
        self._thread = threading.Thread(
            target=self._server.run, kwargs={"sockets": [self._sock]}, daemon=True, name="view"
        )
        self._thread.start()
        deadline = time.monotonic() + timeout_s
        while not self._server.started:  # uvicorn offers no event to wait on
            if not self._thread.is_alive() or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"hallulog view on {self.url} did not start")
            time.sleep(0.01)
        return self

    def stop(self, timeout_s: float = 5.0) -> None:
        if self._server is not None:
            self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout_s)
        for site in getattr(self.app.state, "sites", {}).values():
            site.close()

    def __enter__(self) -> ViewServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
