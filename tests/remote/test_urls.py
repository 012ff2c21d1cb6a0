"""URLs are recognised (also as a Path left them) and parsed; the missing client is one line."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from hallulog.remote.client import S3_EXTRA, Bucket, ObjectStoreError, object_url, split_url


def test_object_url_recognises_urls_and_their_path_form():
    assert object_url("s3://b/p/q") == "s3://b/p/q"
    assert object_url(Path("s3://b/p/q")) == "s3://b/p/q"  # Path collapses the //
    assert object_url("GS://b") == "gs://b"
    for local in ("runs/a", "/abs/path", "./s3/b", "C:/windows", "file_s3:b"):
        assert object_url(local) is None, local


def test_split_url():
    assert split_url("s3://bucket/a/b/") == ("s3", "bucket", "a/b")
    assert split_url(Path("s3://bucket")) == ("s3", "bucket", "")
    with pytest.raises(ObjectStoreError, match="unsupported scheme gs://"):
        split_url("gs://b/p")
    with pytest.raises(ObjectStoreError, match="no bucket name"):
        split_url("s3://")
    with pytest.raises(ObjectStoreError, match="not a URL"):
        split_url("local/dir")


def test_missing_obstore_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "obstore", None)
    monkeypatch.setitem(sys.modules, "obstore.store", None)
    with pytest.raises(ObjectStoreError) as err:
        Bucket("s3://b/p").head("k")
    assert S3_EXTRA in str(err.value) and "s3://b/p" in str(err.value)
