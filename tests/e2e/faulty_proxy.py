"""A real HTTP proxy in front of a real server that fails chosen requests with a 500.

Used to inject server failures into a run (``--manage-servers false --server-urls <proxy>``).
"""

from __future__ import annotations

import socket
import threading
import time

import httpx
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route


class FaultyProxy:
    """Forwards to ``upstream``; requests whose body contains ``fail_substring`` get a 500."""

    def __init__(self, upstream: str, fail_substring: str | None) -> None:
        self.upstream = upstream.rstrip("/")
        self.fail_substring = fail_substring
        self.failed = 0
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        app = Starlette(routes=[Route("/{path:path}", self._forward,
                                      methods=["GET", "POST"])])
        self._server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=self.port,
                                                     log_level="warning"))
        self._thread = threading.Thread(target=self._server.run, daemon=True)

    async def _forward(self, request: Request) -> Response:
        body = await request.body()
        if self.fail_substring and self.fail_substring.encode() in body:
            self.failed += 1
            return JSONResponse({"error": {"message": "injected failure", "type": "server_error",
                                           "code": 500}}, status_code=500)
        async with httpx.AsyncClient(timeout=300) as client:
            upstream = await client.request(request.method,
                                            f"{self.upstream}/{request.path_params['path']}",
                                            content=body,
                                            headers={"content-type": "application/json"})
        return Response(upstream.content, status_code=upstream.status_code,
                        media_type=upstream.headers.get("content-type"))

    def __enter__(self) -> "FaultyProxy":
        self._thread.start()
        deadline = time.monotonic() + 10
        while not self._server.started and time.monotonic() < deadline:
            time.sleep(0.05)
        return self

    def __exit__(self, *exc) -> None:
        self._server.should_exit = True
        self._thread.join(timeout=10)
