"""Object-store URLs and errors: what recognising ``s3://bucket/prefix`` needs, without a client.

``object_url`` recognises a URL (also the form a ``pathlib.Path`` leaves of it, ``s3:/b/p``), so
no URL is ever taken for a local directory; ``split_url`` parses it. The client is
``hallulog.remote.client.Bucket``.
"""

from __future__ import annotations

import os
import re

from hallulog.storage.errors import StorageError

__all__ = [
    "SCHEMES",
    "S3_EXTRA",
    "CHECKSUM_ATTRIBUTE",
    "object_url",
    "split_url",
    "crc32c_hex",
    "ObjectStoreError",
    "ObjectStoreAccessError",
    "ObjectExistsError",
]

_URL = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]+):/+(.*)$")

SCHEMES = ("s3",)
"""URL schemes an artifact root, a push target or a store may have."""
S3_EXTRA = "pip install 'hallulog[s3]'"
"""What installs the object-store client (obstore)."""
CHECKSUM_ATTRIBUTE = "hallulog-crc32c"
"""User metadata (``x-amz-meta-hallulog-crc32c``) of every object hallulog writes: the CRC-32C
of its bytes, 8 hex digits; a retried or resumed upload compares it instead of the bytes."""


def object_url(value: str | os.PathLike) -> str | None:
    """``scheme://rest`` when ``value`` is a URL (given as text, or as a ``Path`` that
    collapsed its ``//``: ``s3:/b/p``), None for a local path. Any scheme is recognised, so a
    caller can refuse one it does not support instead of creating a directory named ``gs:``."""
    m = _URL.match(os.fspath(value))
    if m is None:
        return None
    return f"{m.group(1).lower()}://{m.group(2)}"


def split_url(url: str) -> tuple[str, str, str]:
    """``(scheme, bucket, prefix)`` of ``s3://bucket/prefix`` (prefix without slashes at its
    ends; may be empty). ``ObjectStoreError`` for an unsupported scheme or no bucket."""
    norm = object_url(url)
    if norm is None:
        raise ObjectStoreError(f"{url}: not a URL (expected s3://BUCKET/PREFIX)")
    scheme, _, rest = norm.partition("://")
    if scheme not in SCHEMES:
        raise ObjectStoreError(
            f"{norm}: unsupported scheme {scheme}://; supported: "
            + ", ".join(f"{s}://BUCKET/PREFIX" for s in SCHEMES)
            + " (any S3-compatible server through AWS_ENDPOINT_URL)"
        )
    bucket, _, prefix = rest.partition("/")
    if not bucket:
        raise ObjectStoreError(f"{norm}: no bucket name (expected s3://BUCKET/PREFIX)")
    return scheme, bucket, prefix.strip("/")


def crc32c_hex(crc: int) -> str:
    return f"{crc & 0xFFFFFFFF:08x}"


class ObjectStoreError(StorageError):
    """An object-store operation failed; the message names the endpoint, the bucket and the key."""


class ObjectStoreAccessError(ObjectStoreError, PermissionError):
    """No credentials, wrong credentials, or no permission on the bucket."""


class ObjectExistsError(ObjectStoreError, FileExistsError):
    """A key already holds other bytes than the ones a create-only write would put there."""
