"""The root of hallulog's one error tree.

Every exception a hallulog room defines derives from :class:`HallulogError` (the CLI prints its
message as one line, without a traceback; ``tests/contracts/test_error_tree.py`` checks every
class of the rooms and lists the few outside it with their reason, such as the
``KeyboardInterrupt`` of a clean stop). The branches: :class:`ArtifactError` here (a file of the run),
``StorageError`` (``storage/errors.py``: the activation stores, and the object store's errors of
``remote/``), the configuration's :class:`ConfigError`, the backends' :class:`BackendStartError`
and the workers' request errors (``workers/client.py``), and one class per module for the rest
(``hallulog.api.StatusError``, ``PersistBroken``, ``CaptureError``, ``PushRefused``, ...).
Where an error is a case of a builtin, it is that builtin too (a malformed line is a
``ValueError``, a store not found a ``FileNotFoundError``, a failed rollback an ``OSError``), so
code that catches the builtin keeps working."""

from __future__ import annotations

__all__ = [
    "HallulogError",
    "ArtifactError",
    "MalformedLineError",
    "RetryableError",
    "ConfigError",
    "BackendStartError",
    "ResumeRefused",
]


class HallulogError(Exception):
    """An error the user can act on; the message says what and where."""


class ArtifactError(HallulogError):
    """An artifact file is missing, malformed or inconsistent; the message names the path."""


class MalformedLineError(ArtifactError, ValueError):
    """A complete line of a JSONL file is not a JSON object."""

    def __init__(self, path: str, line: int, what: str) -> None:
        super().__init__(f"{path}:{line}: {what}")
        self.path = path
        self.line = line
        self.what = what


class RetryableError(HallulogError):
    """A failure that may pass if the same request is made again: a connection refused or cut,
    a timeout, HTTP 429 or 5xx. The transport raises it (``workers/http.py``,
    ``workers/client.py``); the client retries it, and once its attempts are spent the run
    re-queues the group with backoff (docs/reliability.md) before it counts as failed."""


class ConfigError(HallulogError, ValueError):
    """A configuration value is invalid; the message names the flag."""


class BackendStartError(HallulogError):
    """A server process exited or did not become healthy in time (fatal for the run)."""


class ResumeRefused(HallulogError):
    """The artifact root holds a run with a different config fingerprint."""
