"""The orchestrator's errors: a branch of hallulog's one error tree (``contracts/errors.py``)."""

from __future__ import annotations

from contracts.errors import ArtifactError, HallulogError, MalformedLineError

__all__ = [
    "HallulogError",
    "BackendStartError",
    "ResumeRefused",
    "ArtifactError",
    "MalformedLineError",
    "ConfigError",
]


class BackendStartError(HallulogError):
    """A server process exited or did not become healthy in time (fatal for the run)."""


class ResumeRefused(HallulogError):
    """The artifact root holds a run with a different config fingerprint."""


class ConfigError(HallulogError, ValueError):
    """A configuration value is invalid; the message names the flag."""
