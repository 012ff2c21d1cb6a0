"""The root of hallulog's error hierarchy, shared by the orchestrator and the workers.

Every error a person can act on derives from :class:`HallulogError`; the CLI prints its message
as one line. ``storage/`` has its own hierarchy (it imports nothing from the rest).
"""

from __future__ import annotations

__all__ = ["HallulogError", "ArtifactError", "MalformedLineError"]


class HallulogError(Exception):
    """An error the user can act on; the message says what and where."""


class ArtifactError(HallulogError):
    """An artifact file is missing, malformed or inconsistent; the message names the path."""


class MalformedLineError(ArtifactError):
    """A complete line of a JSONL file is not a JSON object."""

    def __init__(self, path: str, line: int, what: str) -> None:
        super().__init__(f"{path}:{line}: {what}")
        self.path = path
        self.line = line
