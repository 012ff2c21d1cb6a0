"""``hallulog study run --executor slurm`` on a real one-node Slurm cluster (munged + slurmctld +
slurmd, tests/deploy/slurm_cluster.py): the study's two cells submitted as one array of
``deploy/slurm/study.sbatch``, each task a real run (embedded server, real SmolLM2); both cells
end done, each run's fingerprint the one study.json records; a second submission finds nothing
to do. Skips, saying why, where Slurm cannot be started."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.deploy.slurm_cluster import SlurmCluster, unavailable
from tests.e2e.conftest import free_port_block

pytestmark = [pytest.mark.e2e, pytest.mark.slurm]

REPO = Path(__file__).resolve().parents[2]
WHY = unavailable()
STUDY = """\
limit = 4
max_tokens = 4
k_samples = 1
storage_format = "npy"

[axes]
tasks = [{task = "triviaqa"}, {task = "sciq"}]
"""
FINAL = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY")


@pytest.mark.skipif(WHY is not None, reason=WHY or "")
def test_study_cells_as_a_slurm_array(tmp_path):
    spec = tmp_path / "study.toml"
    spec.write_text(STUDY)
    study = tmp_path / "S"
    cmd = [
        sys.executable, "-m", "orchestrator", "study", "run", str(spec), "--root", str(study),
        "--executor", "slurm", "--sbatch-args", "--cpus-per-task=1 --time=00:30:00",
    ]  # fmt: skip
    with SlurmCluster(ctld_port=9480) as cluster:
        env = {**cluster.env, "BASE_PORT": str(free_port_block(20))}
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120, cwd=REPO)
        assert proc.returncode == 0, proc.stderr + cluster.log("slurmctld")
        job = proc.stdout.split("submitted array job ")[1].split()[0]
        listing = (study / "slurm" / "cells.txt").read_text().splitlines()
        assert [Path(p).name for p in listing] == ["triviaqa.toml", "sciq.toml"]
        deadline = time.monotonic() + 900
        state = ""
        while time.monotonic() < deadline:
            state = cluster.job_state(job)
            if state in FINAL:
                break
            time.sleep(2)
        else:
            cluster.cancel(job)
        logs = "\n".join(
            f"--- {p.name}\n{p.read_text(errors='replace')[-3000:]}"
            for p in sorted((study / "slurm").glob("*.out"))
        )
        assert state == "COMPLETED", f"array job {job}: {state}\n{logs}"
        again = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120, cwd=REPO)
        assert again.returncode == 0 and "every cell is done" in again.stdout, again.stderr

    status = subprocess.run(
        [sys.executable, "-m", "orchestrator", "study", "status", str(study), "--json"],
        capture_output=True, text=True, timeout=60, cwd=REPO,
    )  # fmt: skip
    entries = json.loads(status.stdout)
    assert [(e["cell"], e["state"], e["done"]) for e in entries] == [
        ("triviaqa", "done", 4),
        ("sciq", "done", 4),
    ], logs
    for e in entries:
        assert e["fingerprint"] == e["run_fingerprint"]
