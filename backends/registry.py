"""The backends a run can use, by ``--backend`` name: the one place a name becomes a
:class:`~hallulog.backends.base.Backend` (the run plan calls :func:`backend_for` once)."""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from hallulog.backends.base import Backend
from hallulog.backends.embedded import EmbeddedBackend
from hallulog.backends.vllm import VllmBackend

__all__ = ["BACKENDS", "backend_for"]

BACKENDS: Mapping[str, Backend] = MappingProxyType(
    {backend.name: backend for backend in (EmbeddedBackend(), VllmBackend())}
)
"""Every backend by name (``RunConfig.backend``'s choices are these names)."""


def backend_for(name: str) -> Backend:
    """The backend called ``name``; ValueError naming the choices when there is none."""
    try:
        return BACKENDS[name]
    except KeyError:
        raise ValueError(
            f"--backend: unknown backend {name!r}; choose one of {', '.join(BACKENDS)}"
        ) from None
