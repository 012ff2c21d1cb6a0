"""What a worker records when something fails: the ``errors.jsonl`` row (seed 003 §12 fields),
and which failures are a full disk (the worker stops; docs/reliability.md)."""

from __future__ import annotations

import errno
import traceback
from datetime import datetime, timezone
from typing import Any

__all__ = ["FULL_DISK", "disk_full", "error_record", "utc_now"]

FULL_DISK = (errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EFBIG)
"""errnos after which writing on is pointless until a person frees space: the worker stops."""


def disk_full(exc: BaseException | str) -> bool:
    """A full disk or quota, said by an OSError here or in a server's error message."""
    if isinstance(exc, OSError) and exc.errno in FULL_DISK:
        return True
    text = str(exc)
    return any(
        m in text
        for m in ("No space left on device", "Disk quota exceeded", "[Errno 28]", "[Errno 122]")
    )


def error_record(
    exc: BaseException,
    prompt_id: str | None,
    sample_id: int | None,
    kind: str,
    *,
    worker_id: int,
    server_url: str,
) -> dict[str, Any]:
    """One ``errors.jsonl`` row for ``exc`` (``kind``: ``generation_failed``,
    ``capture_failed``, ``storage_full`` …); an exception with a ``reason`` (a capture whose
    rows failed the check: ``capture_zeros`` …) adds it as ``reason``."""
    row = {
        "timestamp": utc_now(),
        "error_type": kind,
        "prompt_id": prompt_id,
        "sample_id": sample_id,
        "error_message": f"{type(exc).__name__}: {exc}",
        "stack_trace": "".join(traceback.format_exception(type(exc), exc, exc.__traceback__)),
        "worker_id": worker_id,
        "server_url": server_url,
    }
    reason = getattr(exc, "reason", None)
    if isinstance(reason, str):
        row["reason"] = reason
    return row


def utc_now() -> str:
    """The time now, ISO 8601 in UTC."""
    return datetime.now(timezone.utc).isoformat()
