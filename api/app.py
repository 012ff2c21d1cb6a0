"""The status app: routes only. Every handler reads ``get_snapshot()`` (an in-memory copy the
run loop keeps current) in the thread pool, so even a slow snapshot callable cannot stall the
event loop, and no handler touches the filesystem (the dashboard page is read once, here)."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import AsyncIterator, Callable
from importlib import resources

from fastapi import Depends, FastAPI, Query, Request
from fastapi.responses import HTMLResponse, JSONResponse, Response, StreamingResponse
from hallulog.api import metrics
from hallulog.api.auth import TokenCheck
from hallulog.api.errors import install_error_handlers
from starlette.concurrency import run_in_threadpool

__all__ = ["create_app"]

_DASHBOARD = resources.files(__package__).joinpath("dashboard.html").read_text(encoding="utf-8")
_NO_STORE = {"Cache-Control": "no-store"}


def create_app(
    get_snapshot: Callable[[], dict], token: str | None, *, events_interval_s: float = 1.0
) -> FastAPI:
    """The FastAPI app serving ``/status``, ``/metrics``, ``/events`` and the ``/`` dashboard.

    ``token``: when set, every route but the static ``/`` page requires
    ``Authorization: Bearer <token>`` (header only; the page takes the token from its URL
    fragment ``#token=`` and sends it as that header). ``app.state.stopping``
    (a ``threading.Event``) ends open event streams; :class:`hallulog.api.StatusServer` sets it on stop.
    """
    if events_interval_s <= 0:
        raise ValueError(f"events_interval_s must be > 0, got {events_interval_s}")
    check = TokenCheck(token or None, public=frozenset({"/"}))
    app = FastAPI(
        title="hallulog status",
        docs_url=None,
        redoc_url=None,
        openapi_url=None,
        dependencies=[Depends(check)],
    )
    install_error_handlers(app)
    app.state.stopping = threading.Event()
    registry = metrics.make_registry(get_snapshot)

    @app.get("/status")
    async def status() -> JSONResponse:
        return JSONResponse(await run_in_threadpool(get_snapshot), headers=_NO_STORE)

    @app.get("/metrics")
    async def prometheus() -> Response:
        body = await run_in_threadpool(metrics.render, registry)
        return Response(body, media_type=metrics.CONTENT_TYPE, headers=_NO_STORE)

    @app.get("/events")
    async def events(
        request: Request, max_events: int | None = Query(None, ge=1, alias="max")
    ) -> StreamingResponse:
        stream = _event_stream(get_snapshot, app.state.stopping, events_interval_s, max_events)
        return StreamingResponse(
            stream, media_type="text/event-stream", headers={**_NO_STORE, "X-Accel-Buffering": "no"}
        )

    @app.get("/", response_class=HTMLResponse)
    async def dashboard() -> HTMLResponse:
        return HTMLResponse(_DASHBOARD, headers=_NO_STORE)

    return app


async def _event_stream(
    get_snapshot: Callable[[], dict],
    stopping: threading.Event,
    interval_s: float,
    max_events: int | None,
) -> AsyncIterator[str]:
    """SSE: one ``data:`` line with the compact JSON snapshot per interval, first one at once."""
    yield "retry: 2000\n\n"
    sent = 0
    while not stopping.is_set():
        snap = await run_in_threadpool(get_snapshot)
        sent += 1
        yield f"id: {sent}\ndata: {json.dumps(snap, separators=(',', ':'))}\n\n"
        if max_events is not None and sent >= max_events:
            return
        waited = 0.0
        while waited < interval_s and not stopping.is_set():
            step = min(0.2, interval_s - waited)
            await asyncio.sleep(step)
            waited += step
