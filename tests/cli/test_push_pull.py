"""push / pull of an artifact root against a real S3 server (moto, signatures checked).

Exactly once: create-only writes (the server must answer a second create with 412), one version
per key in a versioned bucket after a rerun and after a SIGKILL mid-push; resumable; credentials
absent or wrong are one line naming the endpoint and the bucket; a URL is never a local root.
"""

from __future__ import annotations

import argparse
import filecmp
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from hallulog.cli.push_pull import add_pull_parser, add_push_parser, run_pull, run_push
from hallulog.remote.client import Bucket, RetryPolicy
from hallulog.remote.lease import LOCK_KEY as LEASE_KEY
from hallulog.remote.sync import TREE_LIST
from hallulog.storage import SampleMeta, open_store, open_writer

from tests.s3_server import MotoServer

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def s3():
    with MotoServer(auth=True) as server:
        yield server


@pytest.fixture
def s3env(s3, monkeypatch, tmp_path):
    for k, v in s3.env.items():
        monkeypatch.setenv(k, v)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))  # no ~/.aws of the machine
    return s3


_buckets = iter(range(10_000))


@pytest.fixture
def bucket_name(s3env):
    name = f"push-test-{next(_buckets)}"
    s3env.create_bucket(name, versioned=True)
    return name


def make_root(root: Path, files: int = 3, samples: int = 4) -> Path:
    """A finished artifact root as the run leaves it (manifest, a worker with a packed store,
    consolidated/ with its report), plus what only a live run has (spool, pid, .tmp)."""
    (root / "worker_0").mkdir(parents=True)
    (root / "run_manifest.json").write_text(json.dumps({"run_id": "run-1", "config": {}}))
    w = open_writer("packed", root / "worker_0", layer_ids=[0, 3], hidden_size=16)
    rng = np.random.default_rng(0)
    for i in range(samples):
        t = 5 + i
        w.write(
            f"p{i:02d}_0",
            rng.standard_normal((2, t, 16)).astype(np.float16),
            SampleMeta(prompt_len=2, response_len=t - 2),
        )
    w.close()
    for i in range(files):
        (root / "worker_0" / f"extra_{i}.jsonl").write_text(f'{{"row": {i}}}\n' * (i + 1))
    (root / "worker_0" / "errors.jsonl").write_text("")  # an empty file travels too
    (root / "consolidated").mkdir()
    (root / "consolidated" / "validation_report.json").write_text('{"ok": true}\n')
    (root / "spool" / "server_0").mkdir(parents=True)
    (root / "spool" / "server_0" / "capture.bin").write_bytes(b"in transit")
    (root / "servers").mkdir()
    (root / "servers" / "server_0.pid").write_text("123")
    (root / "servers" / "server_0.log").write_text("log line\n")
    (root / "completed_prompts.json.tmp").write_text("{}")
    return root


def _args(add, argv):
    parser = argparse.ArgumentParser()
    add(parser.add_subparsers(dest="command"))
    return parser.parse_args(argv)


def push(root, url, *extra):
    return run_push(_args(add_push_parser, ["push", str(root), url, *extra]))


def pull(url, root, *extra):
    return run_pull(_args(add_pull_parser, ["pull", url, str(root), *extra]))


def versions(s3, bucket, prefix=""):
    """``{key: versions}``, but the writer's lease (rewritten by design; see ``lease_of``)."""
    out: dict[str, int] = {}
    for page in (
        s3.client().get_paginator("list_object_versions").paginate(Bucket=bucket, Prefix=prefix)
    ):
        for v in page.get("Versions", []):
            if not v["Key"].endswith(f"/{LEASE_KEY}"):
                out[v["Key"]] = out.get(v["Key"], 0) + 1
    return out


def lease_of(s3, bucket, prefix) -> dict:
    body = s3.client().get_object(Bucket=bucket, Key=f"{prefix}/{LEASE_KEY}")["Body"].read()
    return json.loads(body)


def shipped(root: Path) -> set[str]:
    return {
        p.relative_to(root).as_posix()
        for p in root.rglob("*")
        if p.is_file()
        and not p.relative_to(root).as_posix().startswith("spool/")
        and p.suffix not in (".pid", ".tmp")
    }


def test_push_pull_round_trip_once(tmp_path, s3env, bucket_name, capsys):
    root = make_root(tmp_path / "root")
    url = f"s3://{bucket_name}/study/a"
    assert push(root, url) == 0
    keys = versions(s3env, bucket_name)
    want = shipped(root)
    assert set(keys) == {f"study/a/{p}" for p in want | {TREE_LIST}}
    assert set(keys.values()) == {1}  # one version each: nothing written twice
    lease = lease_of(s3env, bucket_name, "study/a")  # held while it wrote, released, not listed
    assert lease["command"] == "push" and lease["released"]
    tree = json.loads(
        s3env.client().get_object(Bucket=bucket_name, Key=f"study/a/{TREE_LIST}")["Body"].read()
    )
    assert LEASE_KEY not in {f["path"] for f in tree["files"]}
    # a second push is a no-op: no PUT, no new version
    assert push(root, url) == 0
    assert "already complete" in capsys.readouterr().out
    assert versions(s3env, bucket_name) == keys

    back = tmp_path / "back"
    assert pull(url, back) == 0
    assert shipped(back) == want and not (back / "spool").exists()
    for rel in want:
        assert filecmp.cmp(root / rel, back / rel, shallow=False), rel
    a, b = open_store(root / "worker_0"), open_store(back / "worker_0")
    assert np.array_equal(a.read(3, 1), b.read(3, 1))
    assert pull(url, back) == 0  # resumable / idempotent: everything is there already
    assert "4 already there" not in capsys.readouterr().err


def test_second_create_is_refused_by_the_server(s3env, bucket_name):
    """The exactly-once guarantee rests on the server honouring If-None-Match: *; a server
    that ignores it fails here."""
    b = Bucket(f"s3://{bucket_name}/cond")
    assert b.put_create("k", b"first") is True
    assert b.put_create("k", b"second") is False  # obstore AlreadyExistsError <- HTTP 412
    assert b.get_bytes("k") == b"first"
    import botocore.exceptions

    with pytest.raises(botocore.exceptions.ClientError) as err:
        s3env.client().put_object(Bucket=bucket_name, Key="cond/k", Body=b"third", IfNoneMatch="*")
    assert err.value.response["ResponseMetadata"]["HTTPStatusCode"] == 412
    assert versions(s3env, bucket_name, "cond/") == {"cond/k": 1}


def test_push_never_overwrites_other_bytes(tmp_path, s3env, bucket_name, capsys):
    root = make_root(tmp_path / "root")
    s3env.client().put_object(Bucket=bucket_name, Key="x/servers/server_0.log", Body=b"other")
    assert push(root, f"s3://{bucket_name}/x") == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "servers/server_0.log" in err
    assert "refusing to overwrite" in err
    body = s3env.client().get_object(Bucket=bucket_name, Key="x/servers/server_0.log")["Body"]
    assert body.read() == b"other"
    assert TREE_LIST not in {k.split("/", 1)[1] for k in versions(s3env, bucket_name)}


def test_pull_of_an_unfinished_push_is_refused(tmp_path, s3env, bucket_name, capsys):
    s3env.client().put_object(Bucket=bucket_name, Key="half/run_manifest.json", Body=b"{}")
    assert pull(f"s3://{bucket_name}/half", tmp_path / "back") == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and TREE_LIST in err and "rerun" in err


def test_push_refuses_an_unfinished_root(tmp_path, s3env, bucket_name, capsys):
    root = make_root(tmp_path / "root")
    (root / "consolidated" / "validation_report.json").unlink()
    assert push(root, f"s3://{bucket_name}/u") == 1
    err = capsys.readouterr().err
    assert "not finished" in err and "--consolidate-only" in err
    assert versions(s3env, bucket_name, "u/") == {}


def test_wrong_credentials_are_one_line(tmp_path, s3env, bucket_name, monkeypatch, capsys):
    root = make_root(tmp_path / "root")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "not-the-secret")
    assert push(root, f"s3://{bucket_name}/w") == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert s3env.endpoint in err and bucket_name in err and "access denied" in err
    assert "not-the-secret" not in err


def test_absent_credentials_are_one_line(tmp_path, s3env, bucket_name, monkeypatch, capsys):
    root = make_root(tmp_path / "root")
    for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_PROFILE"):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    assert push(root, f"s3://{bucket_name}/n") == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert s3env.endpoint in err and bucket_name in err and "no credentials" in err


def test_missing_bucket_and_bad_urls(tmp_path, s3env, capsys):
    root = make_root(tmp_path / "root")
    assert push(root, "s3://no-such-bucket-here/p") == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "no-such-bucket-here" in err and "does not exist" in err
    assert push(root, "gs://b/p") == 2
    assert "unsupported scheme gs://" in capsys.readouterr().err
    assert push(root, "local/dir") == 2
    assert pull("s3://b/p", "s3://c/q") == 2


def test_unsupported_url_artifact_root_is_refused_at_config_validation(tmp_path):
    from hallulog.config.run_config import ConfigError, RunConfig

    # s3:// roots are taken by `run` (tests/cli/test_bucket_run.py)
    with pytest.raises(ConfigError, match="gs:// is not supported"):
        RunConfig(artifact_root=Path("gs://b/p"))


@pytest.mark.e2e
def test_sigkill_mid_push_then_rerun_is_exact(tmp_path, s3env, bucket_name):
    """A push killed half-way (each PUT slowed by a proxy) and rerun: every file once, none
    missing, one version per key."""
    from tests.e2e.faulty_proxy import FaultyProxy

    root = make_root(tmp_path / "root", files=24)
    url = f"s3://{bucket_name}/k"
    slow = lambda method, path, body: ("slow", 0.15) if method == "PUT" else None  # noqa: E731
    with FaultyProxy(s3env.endpoint, fault=slow) as proxy:
        env = {
            **os.environ,
            **s3env.env,
            "AWS_ENDPOINT_URL": proxy.url,
            "HOME": str(tmp_path / "home"),
        }
        proc = subprocess.Popen(
            [
                sys.executable,
                "-c",
                "import sys; from hallulog.cli.push_pull import *; "
                "from tests.cli.test_push_pull import _args; "
                "sys.exit(run_push(_args(add_push_parser, sys.argv[1:])))",
                "push",
                str(root),
                url,
                "--concurrency",
                "2",
            ],
            cwd=REPO,
            env=env,
        )
        deadline = time.monotonic() + 60
        while len(versions(s3env, bucket_name)) < 6:  # some objects are in, most are not
            assert proc.poll() is None and time.monotonic() < deadline, "push ended too soon"
            time.sleep(0.05)
        proc.kill()
        proc.wait()
    before = versions(s3env, bucket_name)
    assert TREE_LIST not in {k.split("/", 1)[1] for k in before}
    assert len(before) < len(shipped(root))
    assert push(root, url) == 0
    after = versions(s3env, bucket_name)
    assert set(after) == {f"k/{p}" for p in shipped(root) | {TREE_LIST}}
    assert set(after.values()) == {1}
    back = tmp_path / "back"
    assert pull(url, back) == 0
    for rel in shipped(root):
        assert filecmp.cmp(root / rel, back / rel, shallow=False), rel


@pytest.mark.e2e
def test_retries_survive_5xx_slow_and_dropped_responses(tmp_path, s3env, bucket_name):
    """A proxy fails every 3rd request with a 503, delays some reads past the client's timeout
    and cuts some response bodies half-way; obstore's retries carry push and pull through."""
    from hallulog.cli.push_pull import pull_root, push_root

    from tests.e2e.faulty_proxy import FaultyProxy

    root = make_root(tmp_path / "root", files=6)
    count = {"n": 0, "get": 0}

    def fault(method, path, body):
        count["n"] += 1
        if count["n"] % 3 == 0:
            return "503"
        if method == "GET":
            count["get"] += 1
            if count["get"] in (2, 9):  # past the client's 1.5 s timeout
                return ("slow", 3.0)
            if count["get"] % 4 == 1:
                return "drop"
        return None

    policy = RetryPolicy(
        init_backoff_s=0.02, max_backoff_s=0.1, request_timeout_s=1.5, retry_timeout_s=30
    )
    url = f"s3://{bucket_name}/f"
    with FaultyProxy(s3env.endpoint, fault=fault) as proxy:
        os.environ["AWS_ENDPOINT_URL"] = proxy.url  # restored by the s3env fixture
        push_root(root, url, bucket=Bucket(url, retry=policy), concurrency=3)
        back = tmp_path / "back"
        pull_root(url, back, bucket=Bucket(url, retry=policy), concurrency=3)
    kinds = {k for k, _, _ in proxy.injected}
    assert {"503", "slow", "drop"} <= kinds, proxy.injected
    for rel in shipped(root):
        assert filecmp.cmp(root / rel, back / rel, shallow=False), rel
    assert set(versions(s3env, bucket_name, "f/").values()) == {1}
