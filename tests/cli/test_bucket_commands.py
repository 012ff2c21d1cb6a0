"""The post-run commands on a root in a bucket: real S3 server (moto, its own process), instant
backends (bench/instant_backend.py), the CLI as a process, a fresh staging directory per step
(each a node whose disk holds nothing of the run).

- a run that drained without consolidating leaves only segments: ``validate`` says so,
  ``consolidate`` on an empty disk rebuilds the root from the segments alone, validates and
  pushes it; a second ``consolidate`` and ``retry`` leave the finished root as it is;
- ``evaluate`` writes its report to ``PREFIX/evaluation`` once (a second is refused), and
  ``pull`` brings it along;
- ``retry`` on segments redoes the prompts they lack and pushes the finished root;
- ``merge`` of two shard roots in the bucket into a third prefix, refused a second time.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
from hallulog.remote.lease import LOCK_KEY

from bench.instant_run import InstantFleet, write_task
from tests.s3_server import MotoServer

REPO = Path(__file__).resolve().parents[2]
K = 1

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def s3():
    with MotoServer() as server:
        yield server


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    with InstantFleet(tmp_path_factory.mktemp("fleet"), servers=1) as f:
        yield f


@pytest.fixture
def cli(s3, fleet, tmp_path, monkeypatch):
    for name, value in s3.env.items():  # pull_root's client, in this process
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    env = {**fleet.env, **s3.env, "HOME": str(tmp_path / "home")}

    def hallulog(*argv: str, node: str | None = None) -> subprocess.CompletedProcess:
        extra = {"HALLULOG_CACHE_DIR": str(tmp_path / (node or "node"))}
        return subprocess.run(
            [sys.executable, "-m", "orchestrator", *argv],
            env={**env, **extra},
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=300,
        )

    def run(url: str, task: Path, *extra: str, node: str = "run-node"):
        cmd = fleet.command(url, task, k=K, extra=["--checkpoint-interval", "0.3", *extra])
        return hallulog(*cmd[3:], node=node)

    hallulog.run = run
    return hallulog


def _check_exact(root: Path, prompts: int) -> None:
    gens = [
        (r["prompt_id"], r["sample_id"])
        for r in map(json.loads, (root / "consolidated" / "generations.jsonl").open())
    ]
    assert max(Counter(gens).values()) == 1, "a generation is duplicated"
    per_prompt = Counter(pid for pid, _ in gens)
    assert len(per_prompt) == prompts and set(per_prompt.values()) == {K + 1}
    committed = [
        json.loads(line)["prompt_id"]
        for w in sorted(root.glob("worker_*"))
        for line in (w / "prompt_index.jsonl").open()
    ]
    assert sorted(committed) == sorted(set(committed)), "a prompt committed twice"
    assert json.loads((root / "consolidated" / "validation_report.json").read_text())["ok"]


def _keys(s3, bucket: str) -> list[str]:
    pages = s3.client().get_paginator("list_objects_v2").paginate(Bucket=bucket)
    return [o["Key"] for page in pages for o in page.get("Contents", [])]


def test_validate_consolidate_evaluate_on_a_bucket_root(cli, s3, tmp_path):
    from hallulog.cli.push_pull import pull_root

    task = tmp_path / "task.jsonl"
    write_task(task, 12)
    s3.create_bucket("postrun", versioned=True)
    url = "s3://postrun/study"
    done = cli.run(url, task, "--consolidate", "false")
    assert done.returncode == 0, done.stderr
    assert "holds the run's segments; the finished root was not pushed" in done.stderr
    assert not any(k.endswith(".hallulog-tree.json") for k in _keys(s3, "postrun"))

    # status reads the bucket's small objects: the segments' line counts, nobody holding it
    status = cli("status", url, "--json", node="node-s")
    assert status.returncode == 0, status.stderr
    snap = json.loads(status.stdout)
    assert snap["source"] == "bucket" and snap["phase"] == "stopped" and snap["lease"] is None
    assert snap["prompts"]["done"] == snap["prompts"]["total"] == 12
    assert snap["generations"] == 12 * (K + 1)
    text = cli("status", "--artifact-root", url, node="node-s")
    assert text.returncode == 0 and "done 12" in text.stdout, text.stdout + text.stderr
    assert "is held by no live command" in text.stdout

    # only segments: validate reports the root unconsolidated, naming the URL's repair
    checked = cli("validate", "--artifact-root", url, node="node-b")
    assert checked.returncode == 1, checked.stdout + checked.stderr
    assert f"hallulog consolidate --artifact-root {url}" in checked.stdout
    assert "holds the run's segments, no finished root" in checked.stderr

    # a node that lost its disk after the drain: consolidated from the segments alone
    made = cli("consolidate", "--artifact-root", url, node="node-c")
    assert made.returncode == 0, made.stdout + made.stderr
    assert f"bucket: {url} (" in made.stdout and "validation OK" in made.stdout.replace(
        "Validation", "validation"
    )
    assert "study/.hallulog-tree.json" in _keys(s3, "postrun")

    snap = json.loads(cli("status", url, "--json", node="node-s").stdout)
    assert snap["phase"] == "done" and snap["prompts"]["done"] == 12
    assert snap["generations"] == 12 * (K + 1)
    assert not [k for k in _keys(s3, "postrun") if "/segments/" in k]  # in the root now

    # the finished root is written once: consolidate and retry leave it alone
    again = cli("consolidate", "--artifact-root", url, node="node-d")
    assert again.returncode == 0 and "nothing to do" in again.stdout
    nothing = cli("retry", "--artifact-root", url, node="node-d")
    assert nothing.returncode == 0 and "nothing to retry" in nothing.stdout, nothing.stderr
    checked = cli("validate", "--artifact-root", url, node="node-b")  # its segments' copy
    assert checked.returncode == 0, checked.stdout + checked.stderr

    scored = cli(
        "evaluate",
        "--artifact-root",
        url,
        "--no-embeddings",
        "--no-plots",
        "--bootstrap",
        "10",
        "--folds",
        "2",
        node="node-e",
    )
    assert scored.returncode == 0, scored.stdout + scored.stderr
    assert f"bucket: {url}/evaluation (" in scored.stdout
    twice = cli("evaluate", "--artifact-root", url, "--no-embeddings", "--no-plots", node="x")
    assert twice.returncode == 1 and "already holds an evaluation" in twice.stderr

    pull_root(url, tmp_path / "pulled")
    _check_exact(tmp_path / "pulled", 12)
    assert (tmp_path / "pulled" / "evaluation" / "report.json").is_file()
    pages = s3.client().get_paginator("list_object_versions").paginate(Bucket="postrun")
    versions = Counter(v["Key"] for page in pages for v in page.get("Versions", []))
    leases = {k for k in versions if k.endswith(LOCK_KEY)}  # rewritten by design: heartbeats
    assert leases == {f"study/{LOCK_KEY}", f"study/evaluation/{LOCK_KEY}"}
    assert {n for k, n in versions.items() if k not in leases} == {1}  # create-only throughout


def test_retry_and_merge_on_bucket_roots(cli, s3, tmp_path):
    from hallulog.cli.push_pull import pull_root

    task = tmp_path / "task.jsonl"
    write_task(task, 12)
    s3.create_bucket("shards")

    # a run whose segments hold 6 of the 12 prompts (a smaller --limit stands for a run that
    # stopped half-way): retry redoes the other 6 and pushes the finished root
    part = cli.run("s3://shards/partial", task, "--limit", "6", "--consolidate", "false")
    assert part.returncode == 0, part.stderr
    redone = cli(
        "retry",
        "--artifact-root",
        "s3://shards/partial",
        "--limit",
        "12",
        "--consolidate",  # the run's recorded config said false
        "true",
        node="n2",
    )
    assert redone.returncode == 0, redone.stdout + redone.stderr
    assert "retrying 6 prompt(s)" in redone.stdout
    assert "bucket: s3://shards/partial (" in redone.stdout
    pull_root("s3://shards/partial", tmp_path / "partial")
    _check_exact(tmp_path / "partial", 12)

    for i in range(2):
        shard = cli.run(f"s3://shards/s{i}", task, "--shard", f"{i}/2", node=f"shard-{i}")
        assert shard.returncode == 0, shard.stderr
    merged = cli(
        "merge", "--out", "s3://shards/merged", "s3://shards/s0", "s3://shards/s1", node="m"
    )
    assert merged.returncode == 0, merged.stdout + merged.stderr
    assert "into s3://shards/merged" in merged.stdout
    pull_root("s3://shards/merged", tmp_path / "merged")
    _check_exact(tmp_path / "merged", 12)
    again = cli(
        "merge", "--out", "s3://shards/merged", "s3://shards/s0", "s3://shards/s1", node="m2"
    )
    assert again.returncode == 1 and "already holds a finished root" in again.stderr


@pytest.mark.parametrize("storage_format", ["zarr", "npy"])
def test_every_store_format_runs_into_a_bucket(cli, s3, tmp_path, storage_format):
    """zarr and npy stores ship as segments too: a run that stopped after 5 prompts (a smaller
    --limit) resumes on another node from the bucket alone, appends to the restored store,
    finishes and pulls back exact."""
    from hallulog.cli.push_pull import pull_root

    task = tmp_path / "task.jsonl"
    write_task(task, 12)
    bucket = f"formats-{storage_format}"
    s3.create_bucket(bucket)
    url = f"s3://{bucket}/study"
    fmt = ("--storage-format", storage_format)
    half = cli.run(url, task, *fmt, "--limit", "5", "--consolidate", "false", node="a")
    assert half.returncode == 0, half.stderr
    rest = cli.run(url, task, *fmt, node="b")  # an empty disk: restored from the segments
    assert rest.returncode == 0, rest.stderr
    assert "(7 this session, 5 before)" in rest.stdout
    pull_root(url, tmp_path / "pulled")
    _check_exact(tmp_path / "pulled", 12)
    manifest = json.loads((tmp_path / "pulled" / "run_manifest.json").read_text())
    assert manifest["storage_format"] == storage_format
