"""``hallulog run --artifact-root s3://…``: a run whose durable root is a bucket.

Real processes throughout: an S3 server (moto, its own process on loopback), instant backends
(bench/instant_backend.py) and the orchestrator CLI. The run ships committed segments with
create-only writes, a SIGKILLed run resumes on a "new node" (an empty staging directory) from the
bucket alone, and the finished root is pushed where ``hallulog pull`` reads it.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest
from hallulog.remote.lease import LOCK_KEY

from bench.instant_run import InstantFleet, write_task
from tests.s3_server import MotoServer

REPO = Path(__file__).resolve().parents[2]


def test_s3_root_passes_config_validation_other_schemes_do_not():
    from hallulog.config.run_config import ConfigError, RunConfig

    for value in ("s3://bucket/study", Path("s3://bucket/study")):
        RunConfig(artifact_root=Path(value))  # every command takes it
    with pytest.raises(ConfigError, match="gs:// is not supported"):
        RunConfig(artifact_root=Path("gs://b/p"))
    with pytest.raises(ConfigError, match="no bucket name"):
        RunConfig(artifact_root="s3://")


@pytest.fixture(scope="module")
def s3():
    with MotoServer() as server:
        yield server


def _keys(s3, bucket: str) -> list[str]:
    pages = s3.client().get_paginator("list_objects_v2").paginate(Bucket=bucket)
    return [o["Key"] for page in pages for o in page.get("Contents", [])]


def _generations(root: Path) -> list[tuple[str, int]]:
    out = []
    with open(root / "consolidated" / "generations.jsonl") as f:
        for line in f:
            row = json.loads(line)
            out.append((row["prompt_id"], row["sample_id"]))
    return out


def _check_exact(root: Path, prompts: int, k: int) -> None:
    gens = _generations(root)
    counts = Counter(gens)
    assert max(counts.values()) == 1, "a generation is duplicated"
    per_prompt = Counter(pid for pid, _ in gens)
    assert len(per_prompt) == prompts
    assert set(per_prompt.values()) == {k + 1}
    report = json.loads((root / "consolidated" / "validation_report.json").read_text())
    assert report["ok"], report


@pytest.fixture
def s3env(s3, monkeypatch, tmp_path):
    for name, value in s3.env.items():  # the in-process client's endpoint and keys
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    return s3


def test_segments_hold_the_committed_prefix_only_and_restore_it(tmp_path, s3env):
    """A real worker directory (packed store): what a commit in flight has written (lines of no
    committed group, shard bytes past the last committed sample) is not shipped; the restored
    directory is the committed prefix byte for byte and recovers to the same prompts."""
    import numpy as np
    from hallulog.remote.client import Bucket, ObjectExistsError
    from hallulog.remote.restore import restore_staging
    from hallulog.remote.shipper import SegmentShipper
    from hallulog.workers.persist import GenerationRecord, WorkerDir, recover_worker_dir

    from hallulog import storage

    def group(pid: str):
        gens = [
            GenerationRecord(
                row={"prompt_id": pid, "sample_id": sid, "text": "x" * 40},
                acts=np.full((2, 3 + sid, 4), sid + 1, dtype="float16"),
                prompt_rows=1,
                response_rows=2 + sid,
                label=1,
                activation_row={
                    "prompt_id": pid,
                    "sample_id": sid,
                    "activation_key": f"{pid}_{sid}",
                },
            )
            for sid in range(2)
        ]
        return {"prompt_id": pid, "prompt": "q?"}, gens

    s3env.create_bucket("segments")
    bucket = Bucket("s3://segments/run")
    root = tmp_path / "stage"
    wd = WorkerDir(
        root / "worker_0",
        worker_id=0,
        storage_format="packed",
        layer_ids=[0, 1],
        hidden_size=4,
        dtype="float16",
    )
    wd.persist_group(*group("p1"))
    shipper = SegmentShipper(root, bucket, {}, interval=60)
    assert shipper.ship() == 1
    wd.persist_group(*group("p2"))
    committed = {
        rel: (root / "worker_0" / rel).read_bytes()
        for rel in (
            "prompt_index.jsonl",
            "generations.jsonl",
            "activation_index.jsonl",
            "activations/commit.log",
            "activations/shard_000000.bin",
        )
    }
    # a commit in flight: its lines and shard bytes are written, its marker is not
    for rel, tail in (
        ("generations.jsonl", b'{"prompt_id":"p3","commit_id":"zz"}\n'),
        ("activation_index.jsonl", b'{"activation_key":"p3_0","commit_id":"zz"}\n'),
        ("activations/shard_000000.bin", b"\x07" * 48),
    ):
        with open(root / "worker_0" / rel, "ab") as f:
            f.write(tail)
    assert shipper.ship() == 1
    assert shipper.ship() == 0  # nothing newly committed
    wd.close()

    new_node = tmp_path / "new-node"
    states = restore_staging(new_node, bucket)
    assert states["worker_0"].seq == 2
    for rel, data in committed.items():
        assert (new_node / "worker_0" / rel).read_bytes() == data, rel
    done = recover_worker_dir(
        new_node / "worker_0",
        storage_format="packed",
        layer_ids=[0, 1],
        hidden_size=4,
        dtype="float16",
    )
    assert done == {"p1", "p2"}
    reader = storage.open_store(new_node / "worker_0")
    assert sorted(reader.keys()) == ["p1_0", "p1_1", "p2_0", "p2_1"]

    # create-only: the same bytes at a key are kept, other bytes are refused
    piece = next(k for k in bucket.list(".hallulog-run/") if "/prompt_index.jsonl.0-" in k)
    data = bucket.get_bytes(piece)
    shipper._put(piece, data, bucket.attributes(piece, len(data))["hallulog-crc32c"])
    with pytest.raises(ObjectExistsError, match="refusing to overwrite"):
        shipper._put(piece, b"other bytes", "00000000")


def test_commands_on_a_bucket_root_fail_in_one_line(tmp_path, s3env, capsys):
    """Bad roots for the commands that take a bucket: one line each (2 for a bad flag)."""
    from hallulog.cli.app import main

    assert main(["merge", "--out", "gs://b/merged", str(tmp_path / "shard")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "gs:// is not supported" in err[0]

    s3env.create_bucket("empty")
    assert main(["evaluate", "--artifact-root", "s3://empty/study", "--no-plots"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "s3://empty/study holds no hallulog run" in err[0], err

    assert main(["validate", "--artifact-root", "s3://no-such-bucket/study"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "the bucket does not exist" in err[0], err


@pytest.mark.e2e
def test_run_into_a_bucket_then_sigkill_and_resume_on_a_new_node(tmp_path, s3, monkeypatch):
    """A finished run to a bucket validates and pulls; a run SIGKILLed (orchestrator, workers
    and all: the node is gone) resumes from an empty staging directory, restoring the committed
    prefix from the bucket, and ends with exactly K+1 generations per prompt, none twice."""
    from hallulog.cli.push_pull import pull_root
    from hallulog.remote.sync import TREE_LIST

    for name, value in s3.env.items():  # pull_root's client, in this process
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))

    k = 2
    small, big = tmp_path / "small.jsonl", tmp_path / "big.jsonl"
    write_task(small, 6)
    write_task(big, 400)
    s3.create_bucket("remote-run", versioned=True)
    with InstantFleet(tmp_path / "fleet", servers=1) as fleet:
        env = {
            **fleet.env,
            **s3.env,
            "HOME": str(tmp_path / "home"),
            "HALLULOG_CACHE_DIR": str(tmp_path / "cache"),
        }

        def hallulog(*argv: str, **kw) -> subprocess.CompletedProcess:
            return subprocess.run(
                [sys.executable, "-m", "orchestrator", *argv],
                env=env,
                cwd=REPO,
                capture_output=True,
                text=True,
                timeout=300,
                **kw,
            )

        # 1. a whole run into the bucket: validated, pushed, pulled back; an object an earlier
        # killed push left with other bytes (a consolidation's own timestamps) is replaced
        s3.client().put_object(
            Bucket="remote-run",
            Key="small/consolidated/prompts.parquet",
            Body=b"left by a killed push",
        )
        done = subprocess.run(
            fleet.command(
                "s3://remote-run/small", small, k=k, extra=["--checkpoint-interval", "0.5"]
            ),
            env=env,
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert done.returncode == 0, done.stderr
        assert "validation OK" in done.stdout
        assert "bucket: s3://remote-run/small" in done.stdout
        keys = _keys(s3, "remote-run")
        assert f"small/{TREE_LIST}" in keys
        # the finished root holds every byte of the segments: they are removed once it is in
        versions = s3.client().list_object_versions(Bucket="remote-run", Prefix="small/")
        shipped_keys = {v["Key"] for v in versions.get("Versions", [])}
        assert any(key.startswith("small/.hallulog-run/segments/worker_0/") for key in shipped_keys)
        assert not any("/.hallulog-run/segments/" in key for key in keys)
        # the default staging directory (one per URL under $HALLULOG_CACHE_DIR/staging) is
        # removed once the finished root is pushed: every byte of it is in the bucket
        assert list((tmp_path / "cache" / "staging").iterdir()) == []
        pull_root("s3://remote-run/small", tmp_path / "pulled")
        _check_exact(tmp_path / "pulled", prompts=6, k=k)
        again = subprocess.run(
            fleet.command("s3://remote-run/small", small, k=k),
            env=env,
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert again.returncode == 1 and "already holds a finished root" in again.stderr

        # 2. SIGKILL of the whole node mid-run, then a new node with an empty staging dir
        cmd = fleet.command(
            "s3://remote-run/big",
            big,
            k=k,
            # 4 groups in flight (not the embedded default's 32): the kill lands mid-run
            extra=[
                "--checkpoint-interval",
                "0.3",
                "--groups-in-flight",
                "4",
                "--staging-dir",
                str(tmp_path / "node-a"),
            ],
        )
        proc = subprocess.Popen(
            cmd,
            env=env,
            cwd=REPO,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )
        deadline = time.monotonic() + 120
        # two segments after the session's fence (number 0)
        second = "big/.hallulog-run/segments/worker_0/00000002.json"
        while second not in _keys(s3, "remote-run"):
            assert proc.poll() is None, proc.stderr.read().decode()
            assert time.monotonic() < deadline, "no segment shipped in 120 s"
            time.sleep(0.05)
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        proc.stderr.close()
        before = _keys(s3, "remote-run")
        assert f"big/{TREE_LIST}" not in before, "killed too late: the run had finished"
        shipped = set()
        for key in before:
            if key.startswith("big/.hallulog-run/segments/") and key.endswith(".json"):
                body = s3.client().get_object(Bucket="remote-run", Key=key)["Body"].read()
                shipped |= set(json.loads(body)["prompt_ids"])
        assert 0 < len(shipped) < 400

        resumed = subprocess.run(
            fleet.command(
                "s3://remote-run/big",
                big,
                k=k,
                extra=["--checkpoint-interval", "0.3", "--staging-dir", str(tmp_path / "node-b")],
            ),
            env=env,
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert resumed.returncode == 0, resumed.stderr
        before_line = next(
            line for line in resumed.stdout.splitlines() if line.startswith("run finished")
        )
        # exactly the prompts the bucket held were restored: the rest were redone
        assert f"({400 - len(shipped)} this session, {len(shipped)} before)" in before_line
        assert not (tmp_path / "node-b").exists()  # pushed: the staging directory is removed
        pull_root("s3://remote-run/big", tmp_path / "pulled-big")
        _check_exact(tmp_path / "pulled-big", prompts=400, k=k)
        # create-only throughout: one version of every key, retried and resumed uploads included
        pages = s3.client().get_paginator("list_object_versions").paginate(Bucket="remote-run")
        versions = Counter(
            v["Key"]
            for page in pages
            for v in page.get("Versions", [])
            if v["Key"].startswith("big/") and not v["Key"].endswith(LOCK_KEY)  # heartbeats
        )
        assert versions and set(versions.values()) == {1}
        validate = hallulog(
            "validate",
            "--artifact-root",
            str(tmp_path / "pulled-big"),
            "--task",
            "triviaqa",
            "--task-path",
            str(big),
        )
        assert validate.returncode == 0, validate.stdout + validate.stderr


@pytest.mark.slow
def test_the_bucket_is_the_truth_a_stale_staging_directory_is_set_aside(tmp_path, s3, monkeypatch):
    """The staging directory is a cache of one run id. A run to s3://b/p finishes and its
    staging directory is removed; a run that stopped before its push keeps one; the prefix is
    emptied and a run with other flags starts on it: the stale staging directory is set aside
    in one line (the default one removed, a --staging-dir moved aside), never a refusal."""
    s3.create_bucket("truth")
    task = tmp_path / "task.jsonl"
    write_task(task, 6)
    cache = tmp_path / "cache"
    with InstantFleet(tmp_path / "fleet", servers=1) as fleet:
        env = {
            **fleet.env,
            **s3.env,
            "HOME": str(tmp_path / "home"),
            "HALLULOG_CACHE_DIR": str(cache),
        }

        def run(k: int, *extra: str) -> subprocess.CompletedProcess:
            return subprocess.run(
                fleet.command("s3://truth/p", task, k=k, extra=list(extra)),
                env=env,
                cwd=REPO,
                capture_output=True,
                text=True,
                timeout=300,
            )

        def empty_prefix() -> None:
            for key in _keys(s3, "truth"):
                s3.client().delete_object(Bucket="truth", Key=key)

        # a finished run: pushed, and its staging directory (the default one) removed
        first = run(2)
        assert first.returncode == 0, first.stderr
        assert "bucket: s3://truth/p (" in first.stdout
        assert "artifacts: s3://truth/p" in first.stdout
        assert list((cache / "staging").iterdir()) == []

        # a run that stops before its push keeps its staging directory: a cache of its run id
        empty_prefix()
        kept = run(2, "--consolidate", "false")
        assert kept.returncode == 0, kept.stderr
        (staging,) = list((cache / "staging").iterdir())
        old_id = json.loads((staging / "run_manifest.json").read_text())["run_id"]

        # the prefix is emptied; a run with other flags starts and says what it set aside
        empty_prefix()
        other = run(3)
        assert other.returncode == 0, other.stderr
        said = [line for line in other.stderr.splitlines() if "staging directory" in line]
        assert len(said) == 1, other.stderr
        assert (
            f"s3://truth/p holds no run: the staging directory {staging} held run {old_id}, removed"
            in said[0]
        )
        assert "different config" not in other.stderr
        pulled = tmp_path / "pulled"
        from hallulog.cli.push_pull import pull_root

        for name, value in s3.env.items():
            monkeypatch.setenv(name, value)
        pull_root("s3://truth/p", pulled)
        _check_exact(pulled, prompts=6, k=3)
        assert json.loads((pulled / "run_manifest.json").read_text())["run_id"] != old_id

        # another run id in the bucket than in a --staging-dir: moved aside, never deleted
        mine = tmp_path / "mine"
        empty_prefix()
        stopped = run(2, "--consolidate", "false", "--staging-dir", str(mine))
        assert stopped.returncode == 0, stopped.stderr
        mine_id = json.loads((mine / "run_manifest.json").read_text())["run_id"]
        (mine / "notes.txt").write_text("the user's own file")
        empty_prefix()
        again = run(3, "--staging-dir", str(mine))
        assert again.returncode == 0, again.stderr
        aside = tmp_path / f"mine.set-aside-{mine_id[:16]}"
        assert f"held run {mine_id}, moved aside to {aside}" in again.stderr
        assert (aside / "notes.txt").read_text() == "the user's own file"
        assert (aside / "run_manifest.json").is_file()
        assert not mine.exists()  # pushed: the staging directory it used is removed
