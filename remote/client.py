"""Object storage (``s3://bucket/prefix``) through obstore: one client wrapper for the whole project.

URLs are recognised and parsed in ``hallulog.remote.url`` (re-exported here). :class:`Bucket` is
the client of one ``s3://bucket/prefix``: create-only writes (``If-None-Match: *``, obstore ``mode="create"``)
and writes conditional on an ETag (``If-Match``, obstore ``UpdateVersion``),
listings, whole and ranged reads (coalesced and concurrent: ``obstore.get_ranges``), streamed
downloads. Every failure is one :class:`ObjectStoreError` line naming the endpoint and the bucket.

Credentials come from the usual chain and are never written anywhere: ``AWS_ACCESS_KEY_ID`` /
``AWS_SECRET_ACCESS_KEY`` / ``AWS_SESSION_TOKEN`` (read by obstore), else boto3's chain when boto3
is installed (``AWS_PROFILE``, ``~/.aws/credentials`` and ``config``, SSO, web identity,
container and instance roles; ``AWS_EC2_METADATA_DISABLED=true`` skips the instance metadata
service), else obstore's own (web identity, container, instance metadata). ``AWS_SKIP_SIGNATURE
=true`` reads public buckets anonymously. The endpoint is AWS's unless ``AWS_ENDPOINT_URL_S3`` or
``AWS_ENDPOINT_URL`` names another (MinIO, Ceph, R2, a test server); an ``http://`` endpoint is
allowed as given. Region: ``AWS_REGION`` / ``AWS_DEFAULT_REGION`` (default ``us-east-1``).
"""

from __future__ import annotations

import logging
import os
import random
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, BinaryIO

from hallulog.remote.url import (
    CHECKSUM_ATTRIBUTE,
    S3_EXTRA,
    SCHEMES,
    ObjectExistsError,
    ObjectStoreAccessError,
    ObjectStoreError,
    crc32c_hex,
    object_url,
    split_url,
)

__all__ = [
    "SCHEMES",
    "S3_EXTRA",
    "CHECKSUM_ATTRIBUTE",
    "object_url",
    "split_url",
    "Bucket",
    "RetryPolicy",
    "ObjectStoreError",
    "ObjectStoreAccessError",
    "ObjectExistsError",
    "crc32c_hex",
]

log = logging.getLogger(__name__)

_CLIENT_PID: int | None = None
"""The process whose obstore runtime is running (a forked child inherits the value, not the
runtime's threads: it must not use a client)."""


@dataclass(frozen=True)
class RetryPolicy:
    """obstore's retries: 5xx, connection errors, dropped connections and timeouts are retried
    with exponential backoff and jitter, up to ``max_retries`` times within ``retry_timeout_s``."""

    max_retries: int = 10
    init_backoff_s: float = 0.1
    max_backoff_s: float = 15.0
    retry_timeout_s: float = 180.0
    request_timeout_s: float = 120.0
    """A whole request (a 2 GiB shard at 20 MB/s needs 100 s)."""
    connect_timeout_s: float = 5.0

    def retry_config(self) -> dict:
        return {
            "max_retries": self.max_retries,
            "retry_timeout": timedelta(seconds=self.retry_timeout_s),
            "backoff": {
                "init_backoff": timedelta(seconds=self.init_backoff_s),
                "max_backoff": timedelta(seconds=self.max_backoff_s),
                "base": 2,
            },
        }


def _endpoint() -> str | None:
    return (
        os.environ.get("AWS_ENDPOINT_URL_S3")
        or os.environ.get("AWS_ENDPOINT_URL")
        or os.environ.get("AWS_ENDPOINT")
    )


def _truthy(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() in ("1", "true", "yes")


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


_BODY_ERRORS = (
    "body error",
    "error decoding response body",
    "connection closed",
    "IncompleteMessage",
    "unexpected end of file",
    "connection reset",
    "error sending request",
    "timed out",
)
"""Failures obstore does not retry itself (a body cut off after the headers; a timed-out PUT):
retried here, within the same ``retry_timeout_s``."""
_ACCESS_CODES = (
    "InvalidAccessKeyId",
    "SignatureDoesNotMatch",
    "AccessDenied",
    "403 Forbidden",
    "ExpiredToken",
    "InvalidToken",
    "401 Unauthorized",
)


class Bucket:
    """The client of one ``s3://bucket/prefix``; keys are relative to the prefix.

    Picklable: the obstore client is made lazily in each process (never carried over a fork)
    and is dropped on pickling; credentials are never part of its state.
    """

    def __init__(self, url: str | os.PathLike, retry: RetryPolicy | None = None) -> None:
        self.scheme, self.bucket, self.prefix = split_url(os.fspath(url))
        self.url = f"{self.scheme}://{self.bucket}" + (f"/{self.prefix}" if self.prefix else "")
        self.endpoint = _endpoint()
        self.retry = retry or RetryPolicy()
        self.where = f"s3 endpoint {self.endpoint or 'AWS (default)'} bucket {self.bucket}"

    # ---- the client -------------------------------------------------------------------------
    def __getstate__(self):
        state = self.__dict__.copy()
        state.pop("_store", None)
        state.pop("_store_pid", None)
        return state

    @property
    def store(self):
        if self.__dict__.get("_store") is None or self.__dict__.get("_store_pid") != os.getpid():
            global _CLIENT_PID
            if _CLIENT_PID not in (None, os.getpid()):
                raise ObjectStoreError(
                    f"{self.url}: read from a process forked after the object-store client "
                    "started in its parent (obstore's runtime does not survive fork()); start "
                    "worker processes with spawn or forkserver, e.g. DataLoader(..., "
                    "multiprocessing_context='spawn')"
                )
            self._store = self._make_store()
            self._store_pid = _CLIENT_PID = os.getpid()
        return self._store

    def _obstore(self):
        try:
            import obstore
        except ImportError:
            raise ObjectStoreError(
                f"{self.url}: object storage needs obstore: {S3_EXTRA}"
            ) from None
        return obstore

    def _make_store(self):
        try:
            from obstore.store import S3Store
        except ImportError:
            raise ObjectStoreError(
                f"{self.url}: object storage needs obstore: {S3_EXTRA}"
            ) from None
        client: dict[str, Any] = {
            "timeout": timedelta(seconds=self.retry.request_timeout_s),
            "connect_timeout": timedelta(seconds=self.retry.connect_timeout_s),
        }
        kwargs: dict[str, Any] = {
            "prefix": self.prefix or None,
            "client_options": client,
            "retry_config": self.retry.retry_config(),
        }
        if self.endpoint:
            kwargs["endpoint"] = self.endpoint
            client["allow_http"] = self.endpoint.startswith("http://")
            kwargs["virtual_hosted_style_request"] = False
        kwargs["region"] = (
            os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION") or "us-east-1"
        )
        if not os.environ.get("AWS_ACCESS_KEY_ID") and not _truthy("AWS_SKIP_SIGNATURE"):
            provider = self._boto3_credentials()
            if provider is not None:
                kwargs["credential_provider"] = provider
        try:
            return S3Store(self.bucket, **kwargs)
        except Exception as exc:  # a bad AWS_* value in the environment
            raise ObjectStoreError(
                f"{self.where}: cannot configure the client: {_first_line(exc)}"
            ) from None

    def _boto3_credentials(self):
        """boto3's credential chain when boto3 is installed (profiles, SSO, roles), else None
        (obstore's own chain). No credentials at all: :class:`ObjectStoreAccessError`."""
        try:
            import boto3
            from obstore.auth.boto3 import Boto3CredentialProvider
        except ImportError:
            return None
        session = boto3.Session()
        try:
            found = session.get_credentials()
        except Exception as exc:  # a broken profile
            raise ObjectStoreAccessError(
                f"{self.where}: cannot load credentials: {_first_line(exc)}"
            ) from None
        if found is None:
            raise ObjectStoreAccessError(
                f"{self.where}: no credentials found (set AWS_ACCESS_KEY_ID and "
                "AWS_SECRET_ACCESS_KEY, or AWS_PROFILE, or run where an instance or container "
                "role is available)"
            )
        return Boto3CredentialProvider(session)

    def display(self, key: str = "") -> str:
        return f"{self.url}/{key}" if key else self.url

    def _error(self, what: str, key: str, exc: BaseException) -> ObjectStoreError:
        text = str(exc)
        line = _first_line(exc)
        name = type(exc).__name__
        if name in ("PermissionDeniedError", "UnauthenticatedError") or any(
            code in text for code in _ACCESS_CODES
        ):
            code = next((c for c in _ACCESS_CODES if c in text), name)
            return ObjectStoreAccessError(
                f"{self.where}: access denied ({code}) on {what} {self.display(key)}: check the "
                "credentials (AWS_ACCESS_KEY_ID / AWS_PROFILE) and the bucket's permissions"
            )
        if "NoSuchBucket" in text:
            return ObjectStoreError(
                f"{self.where}: the bucket does not exist ({what} {self.display(key)})"
            )
        if "Server returned" not in text and any(
            s in text for s in ("Connection refused", "error sending request", "dns error")
        ):
            err = ObjectStoreError(
                f"{self.where}: cannot reach the endpoint ({what} {self.display(key)}): {line}"
            )
            err.transient = True
            return err
        err = ObjectStoreError(f"{self.where}: {what} {self.display(key)} failed: {line}")
        err.transient = any(mark in text for mark in _BODY_ERRORS)
        return err

    def _again(self, thunk):
        """Run an operation, again when it failed in a way obstore does not retry (a response
        body that broke off after the headers; a PUT that timed out). Reads are idempotent, and
        so is a create-only PUT: a retry of one that landed gets 412, which the caller checks."""
        delay = self.retry.init_backoff_s
        deadline = time.monotonic() + self.retry.retry_timeout_s
        for attempt in range(self.retry.max_retries + 1):
            try:
                return thunk()
            except ObjectStoreError as exc:
                if (
                    not getattr(exc, "transient", False)
                    or attempt == self.retry.max_retries
                    or time.monotonic() + delay > deadline
                ):
                    raise
                log.info("%s (retrying in %.2f s)", exc, delay)
                time.sleep(delay * (0.5 + random.random() / 2))
                delay = min(delay * 2, self.retry.max_backoff_s)

    def _call(self, what: str, key: str, fn, *args, **kwargs):
        try:
            return fn(self.store, *args, **kwargs)
        except ObjectStoreError:
            raise
        except FileExistsError:
            raise
        except FileNotFoundError as exc:  # obstore's NotFoundError: callers decide
            if "NoSuchBucket" in str(exc):
                raise self._error(what, key, exc) from None
            raise
        except Exception as exc:
            # obstore's on HTTP 412, and PreconditionError on 404 of an If-Match PUT too
            if type(exc).__name__ in ("AlreadyExistsError", "PreconditionError"):
                raise FileExistsError(str(exc).splitlines()[0]) from None
            raise self._error(what, key, exc) from None

    # ---- operations -------------------------------------------------------------------------
    def delete(self, key: str) -> None:
        """Delete ``key`` (retried like every other operation; a missing key is not an error)."""
        import obstore

        try:
            self._again(lambda: self._call("delete", key, obstore.delete, key))
        except FileNotFoundError:
            pass

    def put_create(self, key: str, data, attributes: dict[str, str] | None = None) -> bool:
        """Create ``key`` with ``data`` (bytes or a buffer) only if it does not exist (one PUT with
        ``If-None-Match: *``). True when this call created it, False when it already existed
        (the caller compares: a retried PUT whose first try landed looks the same)."""
        return self.put_tagged(key, data, attributes, create=True) is not None

    def put_tagged(
        self, key: str, data, attributes=None, *, create: bool = False, if_match: str | None = None
    ) -> str | None:
        """Write ``key`` in one PUT; its new ETag, or None when the condition failed (412; 404 of
        an If-Match on a missing key). ``create``: only if absent (``If-None-Match: *``, obstore
        ``mode="create"``); ``if_match``: only over the version with that ETag (``If-Match``,
        obstore ``UpdateVersion``); neither: unconditionally."""
        obstore = self._obstore()
        mode = "create" if create else "overwrite" if if_match is None else {"e_tag": if_match}
        try:
            done = self._again(
                lambda: self._call(
                    "create" if create else "write",
                    key,
                    obstore.put,
                    key,
                    data,
                    mode=mode,
                    attributes=attributes,
                    use_multipart=False,
                )
            )
        except FileExistsError:
            return None
        return done.get("e_tag") or ""

    def get_tagged(self, key: str) -> tuple[bytes, str] | None:
        """``(bytes, ETag)`` of ``key`` (one GET), None when absent."""
        obstore = self._obstore()

        def whole() -> tuple[bytes, str]:
            result = self._call("read", key, obstore.get, key)
            try:
                return bytes(result.bytes()), str(result.meta.get("e_tag") or "")
            except Exception as exc:
                raise self._error("read", key, exc) from None

        try:
            return self._again(whole)
        except FileNotFoundError:
            return None

    def head(self, key: str) -> dict | None:
        """``{size, e_tag, ...}`` of ``key``, None when absent."""
        obstore = self._obstore()
        try:
            return self._again(lambda: self._call("head", key, obstore.head, key))
        except FileNotFoundError:
            return None

    def attributes(self, key: str, size: int) -> dict[str, str]:
        """The object's attributes (user metadata included), read with a one-byte GET."""
        obstore = self._obstore()
        options = {"range": (0, 1)} if size > 0 else None
        return self._again(
            lambda: dict(self._call("read", key, obstore.get, key, options=options).attributes)
        )

    def list(self, prefix: str = "") -> dict[str, int]:
        """``{key: size}`` of every object under ``prefix`` (relative keys)."""
        obstore = self._obstore()

        def listing() -> dict[str, int]:
            out: dict[str, int] = {}
            try:
                for batch in self._call("list", prefix, obstore.list, prefix or None):
                    for meta in batch:
                        out[meta["path"]] = int(meta["size"])
            except ObjectStoreError:
                raise
            except Exception as exc:  # raised while iterating the pages
                raise self._error("list", prefix, exc) from None
            return out

        return self._again(listing)

    def get_bytes(self, key: str) -> bytes:
        obstore = self._obstore()

        def whole() -> bytes:
            result = self._call("read", key, obstore.get, key)
            try:
                return bytes(result.bytes())
            except Exception as exc:
                raise self._error("read", key, exc) from None

        return self._again(whole)

    def get_ranges(
        self, key: str, starts: Sequence[int], lengths: Sequence[int], coalesce: int = 1 << 20
    ) -> list:
        """The byte ranges of ``key`` (buffers, zero-copy): ranges closer than ``coalesce``
        bytes share one GET, and up to 10 GETs run at once (obstore ``get_ranges``)."""
        obstore = self._obstore()
        return self._again(
            lambda: self._call(
                "read",
                key,
                obstore.get_ranges,
                key,
                starts=list(starts),
                lengths=list(lengths),
                coalesce=coalesce,
            )
        )

    def download(
        self,
        key: str,
        out: BinaryIO,
        chunk_bytes: int = 8 << 20,
        span: tuple[int, int] | None = None,
    ) -> tuple[int, int]:
        """Stream ``key`` (its bytes ``[start, end)`` with ``span``) into ``out``;
        ``(bytes, crc32c)`` of what was written."""
        import google_crc32c

        obstore = self._obstore()
        start = out.tell()
        options = {"range": span} if span is not None else None

        def stream() -> tuple[int, int]:
            out.seek(start)
            out.truncate()
            result = self._call("read", key, obstore.get, key, options=options)
            crc = size = 0
            try:
                for chunk in result.stream(min_chunk_size=chunk_bytes):
                    data = bytes(chunk)  # google_crc32c takes bytes only
                    out.write(data)
                    crc = google_crc32c.extend(crc, data)
                    size += len(data)
            except Exception as exc:
                raise self._error("read", key, exc) from None
            return size, crc

        return self._again(stream)
