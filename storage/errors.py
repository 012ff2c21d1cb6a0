"""One error hierarchy for the activation store.

Every error that concerns a file carries its path (``err.path``) and names it in the message, so
a user can find the damaged file without reading a traceback.
"""

from __future__ import annotations

import os

__all__ = [
    "StorageError",
    "CorruptShardError",
    "ManifestError",
    "UnknownFormatError",
]


class StorageError(Exception):
    """Base class of every error raised by :mod:`storage`."""

    def __init__(self, message: str, path: str | os.PathLike | None = None):
        self.path = os.fspath(path) if path is not None else None
        super().__init__(f"{self.path}: {message}" if self.path else message)


class CorruptShardError(StorageError):
    """A data file is truncated, has the wrong size, or fails its checksum (fatal, not retryable)."""


class ManifestError(StorageError):
    """A manifest, index or metadata file is missing, unparsable or inconsistent with the data."""

    def __init__(self, message: str, path: str | os.PathLike | None = None, line: int | None = None):
        self.line = line
        if line is not None and path is not None:
            path = f"{os.fspath(path)}:{line}"
        super().__init__(message, path)


class UnknownFormatError(StorageError):
    """``open_store`` found no activation store it recognises at the path."""
