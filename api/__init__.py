"""hallulog's live status API: JSON ``/status``, Prometheus ``/metrics``, SSE ``/events`` and an
offline HTML dashboard at ``/``, all read from an in-memory snapshot (see docs/status.md)."""

from hallulog.api.app import create_app
from hallulog.api.client import StatusError, fetch_status, format_status, status_from_artifacts
from hallulog.api.server import StatusServer

__all__ = [
    "create_app",
    "StatusServer",
    "fetch_status",
    "status_from_artifacts",
    "format_status",
    "StatusError",
]
