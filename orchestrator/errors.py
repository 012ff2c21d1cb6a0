"""The orchestrator's error hierarchy: retryable conditions kept apart from fatal ones."""

from __future__ import annotations

__all__ = ["HallulogError", "BackendUnavailable", "BackendStartError", "ResumeRefused",
           "ArtifactError"]


class HallulogError(Exception):
    """Base of every error the orchestrator raises on purpose (the CLI prints its message)."""


class BackendUnavailable(HallulogError):
    """A server cannot be reached right now (retryable)."""


class BackendStartError(HallulogError):
    """A server process exited or did not become healthy in time (fatal for the run)."""


class ResumeRefused(HallulogError):
    """The artifact root holds a run with a different config fingerprint."""


class ArtifactError(HallulogError):
    """An artifact file is missing or malformed; the message names the file (and line)."""
