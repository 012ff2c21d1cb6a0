"""``--executor ray`` with the root in a bucket and nothing else shared: a real multi-node Ray
cluster on this machine (``ray.cluster_utils``: a head without CPUs — the driver's — and two
1-CPU nodes, each with its own ``HALLULOG_CACHE_DIR``, where its actors stage), a real S3 server
(moto, its own process), the real embedded server with SmolLM2 in every actor.

An actor's process is SIGKILLed mid-run, then the whole driver; the rerun completes, and the
root pulled from the bucket holds every prompt exactly once (one commit over all worker
directories, K+1 generations each, none twice), validates clean, and every key of the versioned
bucket has one version. The actors staged on their own nodes: the driver's staging root holds
nothing an actor wrote; once the root is pushed no node keeps a staging directory (the lost
actor's included), nor the driver.
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

from tests.e2e.conftest import REPO, read_jsonl
from tests.s3_server import MotoServer

ray = pytest.importorskip("ray", reason="--executor ray needs `pip install 'ray[default]'`")

pytestmark = [pytest.mark.e2e, pytest.mark.ray]

LIMIT, K = 32, 1  # enough that the run outlasts the kills
URL = "s3://ray-bucket/study"


@pytest.fixture(scope="module")
def s3():
    with MotoServer() as server:
        server.create_bucket("ray-bucket", versioned=True)
        yield server


@pytest.fixture(scope="module")
def cluster(s3, tmp_path_factory):
    from ray.cluster_utils import Cluster

    base = tmp_path_factory.mktemp("nodes")
    c = Cluster(
        initialize_head=True,
        head_node_args={"num_cpus": 0, "gcs_server_port": 9492, "include_dashboard": False},
    )
    c.node_caches = [base / f"node-{i}" for i in range(2)]
    for cache in c.node_caches:  # a node's own disk: where its actors stage
        c.add_node(num_cpus=1, env_vars={**s3.env, "HALLULOG_CACHE_DIR": str(cache)})
    c.wait_for_nodes()
    yield c
    c.shutdown()


def _manifests(s3, history: bool = False) -> list[dict]:
    """The segment manifests in the bucket (``history``: every one ever written, those removed
    once the finished root was pushed included: the bucket is versioned)."""
    client = s3.client()
    if history:
        pages = client.get_paginator("list_object_versions").paginate(Bucket="ray-bucket")
        keys = [(v["Key"], v["VersionId"]) for p in pages for v in p.get("Versions", [])]
    else:
        pages = client.get_paginator("list_objects_v2").paginate(Bucket="ray-bucket")
        keys = [(o["Key"], None) for p in pages for o in p.get("Contents", [])]
    return [
        json.loads(
            client.get_object(Bucket="ray-bucket", Key=k, **({"VersionId": v} if v else {}))[
                "Body"
            ].read()
        )
        for k, v in keys
        if "/segments/" in k and k.endswith(".json")
    ]


def _shipped(s3) -> set[str]:
    return {pid for doc in _manifests(s3) for pid in doc.get("prompt_ids", [])}


def _actor_pids() -> list[int]:
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                cmd = (entry / "cmdline").read_bytes()
            except OSError:
                continue
            if cmd.startswith(b"ray::SlotActor"):
                pids.append(int(entry.name))
    return pids


def _wait(condition, what: str, driver: subprocess.Popen, timeout: float = 600) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert driver.poll() is None, f"the driver exited ({driver.returncode}) before {what}"
        assert time.monotonic() < deadline, f"no {what} in {timeout:.0f} s"
        time.sleep(0.2)


def test_ray_actors_share_only_the_bucket_and_survive_sigkills(cluster, s3, tmp_path, monkeypatch):
    from hallulog.cli.push_pull import pull_root

    for name, value in s3.env.items():  # pull_root's client, in this process
        monkeypatch.setenv(name, value)

    env = {
        **os.environ,
        **s3.env,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
    }
    cmd = [
        sys.executable,
        "-m",
        "orchestrator",
        "run",
        "--artifact-root",
        URL,
        "--staging-dir",
        str(tmp_path / "driver"),
        "--progress",
        "false",
        "--executor",
        "ray",
        "--ray-address",
        cluster.address,
        "--ray-actors",
        "2",
        "--groups-in-flight",
        "1",
        "--checkpoint-interval",
        "0.5",
        "--limit",
        str(LIMIT),
        "--k-samples",
        str(K),
        "--max-tokens",
        "4",
        "--log-level",
        "INFO",
    ]
    log = open(tmp_path / "first.log", "w")
    driver = subprocess.Popen(
        cmd, cwd=REPO, env=env, stdout=log, stderr=log, start_new_session=True
    )
    try:
        _wait(lambda: _shipped(s3), "first shipped segment", driver)
        pids = _actor_pids()
        assert pids, "no actor process found"
        os.kill(pids[0], signal.SIGKILL)  # an actor's process, mid-run
        before = len(_shipped(s3))
        _wait(lambda: len(_shipped(s3)) > before, "segment after the actor's loss", driver)
        _wait(
            lambda: "fenced at segment" in (tmp_path / "first.log").read_text(),
            "fence of the lost slot",
            driver,
        )
        assert len(_shipped(s3)) < LIMIT, "the run finished before the driver could be killed"
        # nothing shared but the bucket: each actor stages under its own node's cache
        staged = sorted(p.name for c in cluster.node_caches for p in c.glob("staging/*/worker_*"))
        assert staged and set(staged) <= {"worker_0", "worker_1"}
        assert not (tmp_path / "driver" / "servers").exists()  # actors' server logs: their nodes
        assert not list((tmp_path / "driver").glob("worker_*"))
        os.killpg(driver.pid, signal.SIGKILL)  # then the driver: its actors go with its job
        driver.wait()
    finally:
        if driver.poll() is None:
            os.killpg(driver.pid, signal.SIGKILL)
        log.close()
    text = (tmp_path / "first.log").read_text()
    assert "lost" in text, text[-3000:]

    resumed = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
    assert resumed.returncode == 0, resumed.stdout[-2000:] + resumed.stderr[-4000:]
    assert f"bucket: {URL} (" in resumed.stdout

    pulled = tmp_path / "pulled"
    pull_root(URL, pulled)
    report = json.loads((pulled / "consolidated" / "validation_report.json").read_text())
    assert report["ok"], report["problems"]
    manifest = json.loads((pulled / "run_manifest.json").read_text())
    assert manifest["executor"]["kind"] == "ray" and manifest.get("finished_at")
    committed = [
        r["prompt_id"]
        for w in sorted(pulled.glob("worker_*"))
        for r in read_jsonl(w / "prompt_index.jsonl")
    ]
    assert len(committed) == LIMIT == len(set(committed)), Counter(committed)
    gens = Counter(
        (g["prompt_id"], g["sample_id"])
        for g in read_jsonl(pulled / "consolidated" / "generations.jsonl")
    )
    assert set(gens.values()) == {1} and len(gens) == LIMIT * (K + 1)
    fences = [doc for doc in _manifests(s3, history=True) if doc.get("fence")]
    assert any(d["fence"].startswith("slot") for d in fences)  # the lost actor's chain
    assert any(d["fence"] == "run, epoch 2" for d in fences)  # the second session's
    assert not [d for d in _manifests(s3)]  # the segments go once the root is pushed
    pages = s3.client().get_paginator("list_object_versions").paginate(Bucket="ray-bucket")
    versions = Counter(
        v["Key"]
        for p in pages
        for v in p.get("Versions", [])
        if not v["Key"].endswith(LOCK_KEY)  # the driver's lease: rewritten by design
    )
    assert set(versions.values()) == {1}, [k for k, n in versions.items() if n > 1]

    # the run pushed: no node keeps a staging directory (a lost actor's included), nor the driver
    assert not [p for c in cluster.node_caches for p in c.glob("staging/*")]
    assert not (tmp_path / "driver").exists()
