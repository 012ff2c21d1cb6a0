"""``--executor ray`` on a real multi-node Ray cluster on this machine (``ray.cluster_utils``: a
head without CPUs — the driver's — and two 1-CPU nodes, one actor each), every actor running the
embedded server with the real SmolLM2 model.

- the same prompts give the same ids, greedy texts and labels as the local executor;
- a node removed in the middle of the run: the run completes on the other node, validation is
  clean, every prompt has exactly K+1 generations and one commit, the lost groups are counted;
- bad input (unreachable address, GPUs the cluster lacks, a root the actors cannot see) is a
  one-line error.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.e2e.conftest import REPO, read_jsonl, run_orchestrator

ray = pytest.importorskip("ray", reason="--executor ray needs `pip install 'ray[default]'`")

pytestmark = [pytest.mark.e2e, pytest.mark.ray]

LIMIT, K = 8, 1  # enough work left after both actors are up and one group is committed
RUN = ("--limit", str(LIMIT), "--k-samples", str(K), "--max-tokens", "8", "--storage-format", "npy")


@pytest.fixture(scope="module")
def cluster():
    from ray.cluster_utils import Cluster

    c = Cluster(
        initialize_head=True,
        head_node_args={"num_cpus": 0, "gcs_server_port": 9490, "include_dashboard": False},
    )
    nodes = [c.add_node(num_cpus=1) for _ in range(2)]
    c.wait_for_nodes()
    c.worker_nodes_list = nodes
    yield c
    c.shutdown()


def _env() -> dict[str, str]:
    return {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
    }


def _committed(root: Path) -> list[str]:
    return (
        [
            r["prompt_id"]
            for w in sorted(root.glob("worker_*"))
            for r in read_jsonl(w / "prompt_index.jsonl")
        ]
        if root.exists()
        else []
    )


def test_ray_run_survives_a_node_loss_and_matches_the_local_run(cluster, tmp_path):
    local = tmp_path / "local"
    proc = run_orchestrator(local, *RUN)
    assert proc.returncode == 0, proc.stderr[-3000:]

    root = tmp_path / "ray"
    cmd = [
        sys.executable,
        "-m",
        "orchestrator",
        "run",
        "--artifact-root",
        str(root),
        "--progress",
        "false",
        "--executor",
        "ray",
        "--ray-address",
        cluster.address,
        "--groups-in-flight",
        "1",
        "--ray-actors",
        "2",
        "--log-level",
        "INFO",
        *RUN,
    ]
    started = time.monotonic()

    def log_text() -> str:
        return (tmp_path / "ray.log").read_text(errors="replace")

    with open(tmp_path / "ray.log", "w") as log:
        driver = subprocess.Popen(cmd, cwd=REPO, env=_env(), stdout=log, stderr=log, text=True)
        removed = False
        while driver.poll() is None and time.monotonic() - started < 900:
            # both actors up (one per node) and a group committed: pull a node
            up = re.findall(r"ray executor: slot \d+ on node \S+, server", log_text())
            if not removed and len(up) >= 2 and _committed(root):
                cluster.remove_node(cluster.worker_nodes_list[1])
                removed = True
            time.sleep(0.1)
        if driver.poll() is None:
            driver.kill()
    out = (tmp_path / "ray.log").read_text()
    assert driver.returncode == 0, out[-4000:]
    assert removed, "the run finished before a group was committed?"

    manifest = json.loads((root / "run_manifest.json").read_text())
    stats = manifest["executor"]
    assert stats["kind"] == "ray" and stats["slots"] == 2 and stats["slots_lost"] == 1, stats
    assert len(set(stats["nodes"].values())) == 2  # one actor per node
    report = json.loads((root / "consolidated" / "validation_report.json").read_text())
    assert report["ok"], report["problems"]
    # exactly once: one commit per prompt over all worker dirs, K+1 generations each
    committed = _committed(root)
    assert sorted(committed) == sorted(set(committed)) and len(committed) == LIMIT
    gens = read_jsonl(root / "consolidated" / "generations.jsonl")
    per_prompt = {p: sorted(g["sample_id"] for g in gens if g["prompt_id"] == p) for p in committed}
    assert all(s == list(range(K + 1)) for s in per_prompt.values())

    # the same ids, greedy texts and labels as the one-node run
    def summary(r: Path):
        prompts = {
            p["prompt_id"]: p["label"]
            for p in read_jsonl(r / "consolidated" / "prompt_index.jsonl")
        }
        greedy = {
            g["prompt_id"]: g["text"]
            for g in read_jsonl(r / "consolidated" / "generations.jsonl")
            if g["sample_id"] == 0
        }
        return prompts, greedy

    assert summary(root) == summary(local)
    print(f"ray run with a node loss: {stats}")


def test_bad_ray_inputs_are_one_line_errors(cluster, tmp_path):
    proc = run_orchestrator(
        tmp_path / "a", "--executor", "ray", "--ray-address", "127.0.0.1:9499", *RUN, timeout=300
    )
    err = proc.stderr.strip().splitlines()[-1]  # after the startup messages: one line
    assert proc.returncode == 1 and err.startswith(
        "error: --ray-address 127.0.0.1:9499: no Ray cluster reachable there"
    ), proc.stderr
    proc = run_orchestrator(
        tmp_path / "b",
        "--executor",
        "ray",
        "--ray-address",
        cluster.address,
        "--gpus",
        "0",
        *RUN,
        timeout=300,
    )
    err = proc.stderr.strip().splitlines()[-1]
    assert proc.returncode == 1 and "has no GPUs" in err, proc.stderr[-2000:]
    proc = run_orchestrator(
        tmp_path / "c",
        "--executor",
        "ray",
        "--ray-address",
        cluster.address,
        "--ray-actors",
        "5",
        *RUN,
        timeout=300,
    )
    err = proc.stderr.strip().splitlines()[-1]
    assert proc.returncode == 1 and "need 5 CPUs" in err, proc.stderr[-2000:]


def test_an_actor_refuses_a_root_it_cannot_see(tmp_path):
    """The shared-filesystem check, on the actor class itself (one machine cannot unshare a
    directory between Ray nodes): the driver's probe file missing or different there."""
    from hallulog.workers.ray_actor import PROBE_NAME, SharedFsError, SlotActor

    (tmp_path / PROBE_NAME).write_text("driver-token")
    actor = SlotActor(0, None, {}, str(tmp_path / "elsewhere"), "driver-token", {})
    with pytest.raises(SharedFsError, match="is not shared with node .*missing"):
        actor.start()
    actor = SlotActor(0, None, {}, str(tmp_path), "another-token", {})
    with pytest.raises(SharedFsError, match="different"):
        actor.start()
