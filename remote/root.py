"""Artifact roots that are URLs (``s3://bucket/prefix``): recognised before anything is written.

Every command takes an ``s3://`` root and works on a local staging copy of it
(``cli/bucket_staging.py``); a URL of another scheme is refused at config validation,
instead of becoming a local directory named ``gs:``. docs/object-storage.md.
"""

from __future__ import annotations

import os

from hallulog.remote.client import SCHEMES, object_url

__all__ = ["check_artifact_root", "artifact_root_problem"]


def artifact_root_problem(value: str | os.PathLike, flag: str = "--artifact-root") -> str | None:
    """One line saying why ``value`` cannot be an artifact root, None for a local path or an
    ``s3://`` URL."""
    url = object_url(value)
    if url is None:
        return None
    scheme = url.partition("://")[0]
    if scheme not in SCHEMES:
        return (
            f"{flag} {url}: {scheme}:// is not supported; an artifact root is a local or "
            "shared-filesystem path, or s3://BUCKET/PREFIX"
        )
    from hallulog.remote.client import ObjectStoreError, split_url

    try:
        split_url(url)
    except ObjectStoreError as exc:
        return f"{flag} {exc}"
    return None


def check_artifact_root(value: str | os.PathLike, flag: str = "--artifact-root") -> None:
    """``ConfigError`` when ``value`` is a URL no command takes (see
    :func:`artifact_root_problem`)."""
    problem = artifact_root_problem(value, flag)
    if problem is not None:
        from hallulog.contracts.errors import ConfigError

        raise ConfigError(problem)
