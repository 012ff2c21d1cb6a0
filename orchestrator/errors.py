"""The orchestrator's error hierarchy: retryable conditions kept apart from fatal ones."""

from __future__ import annotations

from contracts.errors import ArtifactError, HallulogError, MalformedLineError

__all__ = ["HallulogError", "BackendUnavailable", "BackendStartError", "ResumeRefused",
           "ArtifactError", "MalformedLineError"]


class BackendUnavailable(HallulogError):
    """A server cannot be reached right now (retryable)."""


class BackendStartError(HallulogError):
    """A server process exited or did not become healthy in time (fatal for the run)."""


class ResumeRefused(HallulogError):
    """The artifact root holds a run with a different config fingerprint."""


class ConfigError(ValueError):
    """A configuration value is invalid; the message names the flag."""
