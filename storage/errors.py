"""The activation store's errors: a branch of hallulog's one error tree.

:class:`StorageError` derives from :class:`hallulog.contracts.errors.HallulogError` (the CLI prints it as
one line), and each error is also the builtin it is a case of, as zarr's are: code that catches
``ValueError`` or ``FileNotFoundError`` keeps working. Every error that concerns a file carries
its path (``err.path``) and names it in the message, so a user can find the damaged file
without reading a traceback.
"""

from __future__ import annotations

import os

from hallulog.contracts.errors import HallulogError

__all__ = [
    "StorageError",
    "CorruptShardError",
    "ManifestError",
    "UnknownFormatError",
    "StoreNotFoundError",
]


class StorageError(HallulogError):
    """Base class of every error raised by :mod:`storage`."""

    def __init__(self, message: str, path: str | os.PathLike | None = None):
        self.path = os.fspath(path) if path is not None else None
        super().__init__(f"{self.path}: {message}" if self.path else message)


class CorruptShardError(StorageError, ValueError):
    """A data file is truncated, has the wrong size, or fails its checksum (fatal, not retryable)."""


class ManifestError(StorageError, ValueError):
    """A manifest, index or metadata file is missing, unparsable or inconsistent with the data."""

    def __init__(
        self, message: str, path: str | os.PathLike | None = None, line: int | None = None
    ):
        self.line = line
        if line is not None and path is not None:
            path = f"{os.fspath(path)}:{line}"
        super().__init__(message, path)


class UnknownFormatError(StorageError, ValueError):
    """A format name that is not one of ``hallulog.storage.FORMATS`` (``open_writer``), or a path where
    ``open_store`` recognises no activation store."""


class StoreNotFoundError(UnknownFormatError, FileNotFoundError):
    """``open_store`` was given a path that does not exist."""
