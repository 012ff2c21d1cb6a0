"""The worker's HTTP/1.1 transport: JSON POSTs over pooled keep-alive connections.

The worker sends two kinds of request, both a JSON POST with a JSON reply, hundreds per second
per worker. aiohttp spent ~0.45 ms of CPU on each against the instant bench backend (request and
response objects, header multidicts, timers, payload writers), as did aiosonic, pyreqwest and
rnet; an asyncio protocol around ``httptools``' parser (uvicorn's) does the same request in
~0.18 ms, so that is what this module is (docs/performance.md, "the HTTP client").

What it does: ``http`` and ``https`` URLs; one connection per request in flight, reused LIFO
while idle less than ``keepalive_s`` (below the servers' own 5 s, so the client drops an idle
connection before the server does); replies delimited by Content-Length, chunked, or the end of
the connection; ``Connection: close`` honoured. A reused connection the server closed before
answering is retried once at once on a fresh one (the server never read that request). Every
transport failure is an :class:`HTTPConnectionError`; the total time of a request is bounded by
``timeout`` (``TimeoutError``). Redirects, proxies, cookies and compression are not handled: the
backends (the embedded server, vLLM, the bench backend) use none.
"""

from __future__ import annotations

import asyncio
import ssl
import sys
import time
from urllib.parse import urlsplit

import httptools
from hallulog.contracts.errors import RetryableError

__all__ = ["HTTPConnectionError", "HTTPTimeoutError", "HTTPPool"]


class HTTPConnectionError(RetryableError, ConnectionError):
    """The connection failed: refused, reset, closed before the reply ended, or garbled."""


class HTTPTimeoutError(RetryableError, asyncio.TimeoutError):
    """The whole request took longer than the pool's ``timeout``."""


class _Connection(asyncio.Protocol):
    """One keep-alive connection; one request at a time."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.reply: asyncio.Future[tuple[int, bytes]] | None = None
        self.chunks: list[bytes] = []
        self.received = False  # any byte of the current reply
        self.headers_done = False
        self.delimited = False  # Content-Length or chunked: the reply's end is in the stream
        self.keep_alive = True
        self.closed = False
        self.idle_since = 0.0

    # asyncio.Protocol
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self.received = True
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self._fail(HTTPConnectionError(f"malformed HTTP reply: {exc}"))
            self.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self.reply is None or self.reply.done():
            return
        if self.headers_done and not self.delimited:  # the reply ends with the connection
            self.keep_alive = False
            self._finish()
            return
        self._fail(
            HTTPConnectionError(
                "server closed the connection before the reply was complete"
                + (f": {exc}" if exc else "")
            )
        )

    # httptools callbacks
    def on_header(self, name: bytes, value: bytes) -> None:
        if name.lower() in (b"content-length", b"transfer-encoding"):
            self.delimited = True

    def on_headers_complete(self) -> None:
        self.headers_done = True

    def on_body(self, body: bytes) -> None:
        self.chunks.append(body)

    def on_message_complete(self) -> None:
        self.keep_alive = self.parser.should_keep_alive()
        self._finish()

    # the pool's side
    def start(
        self, request: bytes, loop: asyncio.AbstractEventLoop
    ) -> asyncio.Future[tuple[int, bytes]]:
        self.reply = loop.create_future()
        self.chunks, self.received, self.headers_done, self.delimited = [], False, False, False
        self.transport.write(request)  # type: ignore[union-attr]
        return self.reply

    def close(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.close()

    def _finish(self) -> None:
        if self.reply is not None and not self.reply.done():
            body = self.chunks[0] if len(self.chunks) == 1 else b"".join(self.chunks)
            self.reply.set_result((self.parser.get_status_code(), body))
        self.chunks = []

    def _fail(self, exc: Exception) -> None:
        if self.reply is not None and not self.reply.done():
            self.reply.set_exception(exc)


class HTTPPool:
    """POSTs to one server (``base_url``: scheme, host, port, optional path prefix)."""

    def __init__(self, base_url: str, *, timeout: float = 300.0, keepalive_s: float = 4.0) -> None:
        parts = urlsplit(base_url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"not an http(s) URL: {base_url!r}")
        self.host = parts.hostname
        self.port = parts.port or (443 if parts.scheme == "https" else 80)
        self.prefix = parts.path.rstrip("/")
        self.url = base_url.rstrip("/")
        self._ssl = ssl.create_default_context() if parts.scheme == "https" else None
        host_header = parts.netloc.rpartition("@")[2]  # user:password@ is not sent
        self._head = (
            "POST {path} HTTP/1.1\r\nHost: "
            + host_header
            + "\r\nContent-Type: {ctype}\r\nContent-Length: {length}\r\n"
            "Accept: application/json\r\n\r\n"
        )
        self.timeout = timeout
        self.keepalive_s = keepalive_s
        self._idle: list[_Connection] = []

    async def post(
        self, path: str, body: bytes, *, content_type: str = "application/json"
    ) -> tuple[int, bytes]:
        """POST ``body`` to ``prefix + path``; the reply's status and body.

        Raises :class:`HTTPConnectionError` on a transport failure and :class:`HTTPTimeoutError`
        (a ``TimeoutError``) when the whole request takes longer than ``timeout`` seconds; both
        are :class:`~hallulog.contracts.errors.RetryableError`.
        """
        request = (
            self._head.format(path=self.prefix + path, ctype=content_type, length=len(body)).encode(
                "latin-1"
            )
            + body
        )
        try:
            if sys.version_info < (3, 11):  # no asyncio.timeout
                return await asyncio.wait_for(self._send(request), self.timeout)
            async with asyncio.timeout(self.timeout):
                return await self._send(request)
        except asyncio.TimeoutError as exc:
            if isinstance(exc, HTTPTimeoutError):
                raise
            raise HTTPTimeoutError(
                f"{self.url}{path}: no complete reply within {self.timeout:g} s"
            ) from None

    async def _send(self, request: bytes) -> tuple[int, bytes]:
        conn = self._take_idle()
        if conn is not None:
            try:
                return await self._exchange(conn, request)
            except HTTPConnectionError:
                if conn.received:
                    raise  # the server read the request and started a reply
        return await self._exchange(await self._connect(), request)

    async def close(self) -> None:
        """Close every idle connection (connections in use close when their request ends)."""
        idle, self._idle = self._idle, []
        for conn in idle:
            conn.close()

    def _take_idle(self) -> _Connection | None:
        now = time.monotonic()
        while self._idle:
            conn = self._idle.pop()
            if not conn.closed and now - conn.idle_since < self.keepalive_s:
                return conn
            conn.close()
        return None

    async def _connect(self) -> _Connection:
        loop = asyncio.get_running_loop()
        try:
            _, conn = await loop.create_connection(_Connection, self.host, self.port, ssl=self._ssl)
        except OSError as exc:  # refused, unreachable, TLS handshake failures
            raise HTTPConnectionError(f"cannot connect to {self.url}: {exc}") from exc
        return conn

    async def _exchange(self, conn: _Connection, request: bytes) -> tuple[int, bytes]:
        try:
            status, body = await conn.start(request, asyncio.get_running_loop())
        except BaseException:  # cancelled, timed out or failed: the reply may still come
            conn.close()
            raise
        if conn.keep_alive and not conn.closed:
            conn.idle_since = time.monotonic()
            self._idle.append(conn)
        else:
            conn.close()
        return status, body
