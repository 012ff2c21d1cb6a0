"""A real HTTP proxy in front of a real server that fails chosen requests.

Used to inject server failures into a run (``--manage-servers false --server-urls <proxy>``):
requests whose body contains ``fail_substring`` get a 500. With ``fault`` (a callable of the
method, the path and the body) any request can instead get a 500 (``"500"``), a 503
(``"503"``), a response delayed by S seconds (``("slow", S)``), a request held until a
``threading.Event`` is set (``("hold", event)``), or a connection dropped half-way through the
response body (``"drop"``); every method is forwarded, headers and bytes as they
are (the S3 tests put it in front of a moto server).
"""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import Callable

import httpx
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

Fault = Callable[[str, str, bytes], "str | tuple[str, float] | None"]

_HOP_HEADERS = {
    "host",
    "content-length",
    "transfer-encoding",
    "connection",
    "keep-alive",
    "content-encoding",
}


class FaultyProxy:
    """Forwards to ``upstream``; requests whose body contains ``fail_substring`` get a 500, and
    ``fault(method, path, body)`` picks a fault for any request (None: forward it)."""

    def __init__(
        self, upstream: str, fail_substring: str | None = None, fault: Fault | None = None
    ) -> None:
        self.upstream = upstream.rstrip("/")
        self.fail_substring = fail_substring
        self.fault = fault
        self.failed = 0
        self.injected: list[tuple[str, str, str]] = []  # (fault, method, path)
        self.answered: list[tuple[str, str, str, int]] = []  # ... and the upstream's status
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        app = Starlette(
            routes=[
                Route(
                    "/{path:path}", self._forward, methods=["GET", "POST", "PUT", "HEAD", "DELETE"]
                )
            ]
        )
        self._server = uvicorn.Server(
            uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="critical")
        )
        self._thread = threading.Thread(target=self._server.run, daemon=True)

    async def _forward(self, request: Request) -> Response:
        body = await request.body()
        if self.fail_substring and self.fail_substring.encode() in body:
            self.failed += 1
            return JSONResponse(
                {"error": {"message": "injected failure", "type": "server_error", "code": 500}},
                status_code=500,
            )
        path = request.url.path
        action = self.fault(request.method, path, body) if self.fault else None
        if action is not None:
            kind = action[0] if isinstance(action, tuple) else action
            self.injected.append((kind, request.method, path))
            if kind in ("500", "503"):
                return Response(
                    b"<Error><Code>InternalError</Code></Error>",
                    status_code=int(kind),
                    media_type="application/xml",
                )
            if kind == "slow":
                await asyncio.sleep(float(action[1]))
            if kind == "hold":  # until the test lets it go (a threading.Event)
                await asyncio.to_thread(action[1].wait)
        headers = {k: v for k, v in request.headers.items() if k.lower() not in _HOP_HEADERS}
        headers["host"] = request.headers.get("host", "")
        target = f"{self.upstream}{path}"
        if request.url.query:
            target += f"?{request.url.query}"
        async with httpx.AsyncClient(timeout=300) as client:
            upstream = await client.request(request.method, target, content=body, headers=headers)
        if action is not None:
            self.answered.append((kind, request.method, path, upstream.status_code))
        out_headers = {
            k: v
            for k, v in upstream.headers.items()
            if k.lower() not in _HOP_HEADERS - {"content-length"}
        }
        if action == "drop" and len(upstream.content) > 1:
            data = upstream.content

            async def half_then_cut():
                yield data[: len(data) // 2]
                raise ConnectionResetError("injected: connection dropped mid-body")

            return StreamingResponse(
                half_then_cut(), status_code=upstream.status_code, headers=out_headers
            )
        if request.method == "HEAD":
            return Response(b"", status_code=upstream.status_code, headers=out_headers)
        out_headers.pop("content-length", None)
        return Response(upstream.content, status_code=upstream.status_code, headers=out_headers)

    def __enter__(self) -> FaultyProxy:
        self._thread.start()
        deadline = time.monotonic() + 10
        while not self._server.started and time.monotonic() < deadline:
            time.sleep(0.05)
        return self

    def __exit__(self, *exc) -> None:
        self._server.should_exit = True
        self._thread.join(timeout=10)
