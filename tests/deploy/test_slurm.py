"""deploy/slurm on a real Slurm: a one-node cluster (munged + slurmctld + slurmd) started by the
test, ``deploy/slurm/submit.sh`` submitting an array of 2 shards of a real run (embedded server,
real SmolLM2) and the merge job (afterok); the merged root validates and holds exactly the
prompts of the unsharded run. Skips, saying why, where Slurm cannot be started."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hallulog.tasks import load_task

from tests.deploy.slurm_cluster import SlurmCluster, unavailable

pytestmark = [pytest.mark.e2e, pytest.mark.slurm]

REPO = Path(__file__).resolve().parents[2]
WHY = unavailable()


@pytest.mark.skipif(WHY is not None, reason=WHY or "")
def test_slurm_array_of_shards_then_merge(tmp_path):
    out = tmp_path / "out"
    limit, k = 4, 1
    with SlurmCluster(ctld_port=9460) as cluster:
        env = {
            **cluster.env,
            "SHARDS": "2",
            "GPUS_PER_NODE": "0",
            "CPUS_PER_TASK": "1",
            "MERGE_CPUS": "1",
            "TIME_LIMIT": "00:30:00",
            "OUT": str(out),
            "HALLULOG_DIR": str(REPO),
            "PYTHON": sys.executable,
            "BASE_PORT": "9470",
            "RUN_ARGS": f"--limit {limit} --k-samples {k} --max-tokens 4 "
            "--storage-format npy --num-workers 1",
            "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
        }
        proc = subprocess.run(
            ["bash", str(REPO / "deploy" / "slurm" / "submit.sh")],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert proc.returncode == 0, proc.stderr + cluster.log("slurmctld")
        words = proc.stdout.split()
        array_job, merge_job = words[words.index("shards:") + 2], words[words.index("merge:") + 2]
        deadline = time.monotonic() + 900
        state = ""
        while time.monotonic() < deadline:
            state = cluster.job_state(merge_job)
            if state in (
                "COMPLETED",
                "FAILED",
                "CANCELLED",
                "TIMEOUT",
                "NODE_FAIL",
                "OUT_OF_MEMORY",
            ):
                break
            if cluster.job_state(array_job) in ("FAILED", "CANCELLED", "TIMEOUT"):
                break
            time.sleep(2)
        else:
            cluster.cancel(array_job, merge_job)
        logs = "\n".join(
            f"--- {p.name}\n{p.read_text(errors='replace')[-3000:]}"
            for p in sorted((out / "slurm-logs").glob("*.out"))
        )
        assert state == "COMPLETED", f"merge job {merge_job}: {state}\n{logs}"

    for i in range(2):
        manifest = json.loads((out / f"shard_{i}_of_2" / "run_manifest.json").read_text())
        assert manifest["shard"] == f"{i}/2"
    merged = out / "merged"
    report = json.loads((merged / "consolidated" / "validation_report.json").read_text())
    assert report["ok"], report["problems"]
    expected = {g.prompt_id for g in load_task("triviaqa", limit=limit).groups}
    rows = [
        json.loads(line)
        for line in (merged / "consolidated" / "prompt_index.jsonl").read_text().splitlines()
    ]
    assert sorted(r["prompt_id"] for r in rows) == sorted(expected)
    gens = (merged / "consolidated" / "generations.jsonl").read_text().splitlines()
    assert len(gens) == limit * (k + 1)
    assert (merged / "consolidated" / "exports").is_dir()
    assert "validation OK" in logs
