"""``StatusServer``: the status app under uvicorn in a daemon thread of the orchestrator."""

from __future__ import annotations

import logging
import socket
import threading
import time
from collections.abc import Callable

import uvicorn
from hallulog.api.app import create_app
from hallulog.api.auth import require_token_off_loopback

__all__ = ["StatusServer"]

log = logging.getLogger(__name__)


class StatusServer:
    """Serve ``create_app(get_snapshot, token)`` on ``host:port`` from a daemon thread.

    The constructor refuses a non-loopback host without a token (``ValueError`` naming
    ``--status-token``). :meth:`start` binds the socket in the calling thread (so "address in use"
    raises there, as ``OSError``), returns once uvicorn is serving, and :meth:`stop` ends open
    event streams and the server. ``port=0`` picks a free port; read it from :attr:`port`.
    """

    def __init__(
        self,
        get_snapshot: Callable[[], dict],
        host: str = "127.0.0.1",
        port: int = 0,
        token: str | None = None,
        *,
        events_interval_s: float = 1.0,
        start_timeout_s: float = 10.0,
    ) -> None:
        require_token_off_loopback(host, token)
        self.host = host
        self.port = port
        self.token = token or None
        self._start_timeout_s = start_timeout_s
        self.app = create_app(get_snapshot, self.token, events_interval_s=events_interval_s)
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    def start(self) -> StatusServer:
        if self._thread is not None:
            raise RuntimeError("status server already started")
        sock = self._bind()
        self.port = sock.getsockname()[1]
        config = uvicorn.Config(
            self.app,
            log_level="warning",
            access_log=False,
            lifespan="off",
            timeout_graceful_shutdown=2,
            ws="none",
        )
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(
            target=self._server.run, kwargs={"sockets": [sock]}, name="status-api", daemon=True
        )
        self._thread.start()
        deadline = time.monotonic() + self._start_timeout_s
        while not self._server.started:
            if not self._thread.is_alive():
                sock.close()
                raise RuntimeError(
                    f"status server on {self.url} exited during start-up (see the log above)"
                )
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(
                    f"status server on {self.url} not up after {self._start_timeout_s:.0f} s"
                )
            time.sleep(0.01)
        log.info("status API on %s (token %s)", self.url, "required" if self.token else "off")
        return self

    def stop(self, timeout_s: float = 5.0) -> None:
        self.app.state.stopping.set()
        if self._server is not None:
            self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout_s)
            if self._thread.is_alive():
                log.warning(
                    "status API thread still running after %.0f s; leaving it (daemon)", timeout_s
                )

    def __enter__(self) -> StatusServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _bind(self) -> socket.socket:
        infos = socket.getaddrinfo(
            self.host, self.port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )
        family, socktype, proto, _, addr = infos[0]
        sock = socket.socket(family, socktype, proto)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind(addr)
            sock.listen(128)
        except OSError as exc:
            sock.close()
            raise OSError(
                exc.errno,
                f"status API cannot listen on {self.host}:{self.port}: "
                f"{exc.strerror} (choose another --status-port)",
            ) from exc
        return sock
