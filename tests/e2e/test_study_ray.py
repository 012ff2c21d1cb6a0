"""``hallulog study run --executor ray`` on a real Ray cluster on this machine
(``ray.cluster_utils``: a head without CPUs and one 1-CPU node): two cells, one after another,
each a run whose actor (the embedded server with the real SmolLM2 model) runs on the cluster;
both cells end done and their manifests say the Ray executor ran them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.e2e.conftest import REPO

ray = pytest.importorskip("ray", reason="--executor ray needs `pip install 'ray[default]'`")

pytestmark = [pytest.mark.e2e, pytest.mark.ray]

STUDY = """\
limit = 3
max_tokens = 4
k_samples = 1
progress = false
storage_format = "npy"

[axes]
tasks = [{task = "triviaqa"}, {task = "sciq"}]
"""


@pytest.fixture(scope="module")
def cluster():
    from ray.cluster_utils import Cluster

    c = Cluster(
        initialize_head=True,
        head_node_args={"num_cpus": 0, "gcs_server_port": 9495, "include_dashboard": False},
    )
    c.add_node(num_cpus=1)
    c.wait_for_nodes()
    yield c
    c.shutdown()


def test_study_cells_on_ray_one_after_another(cluster, tmp_path: Path):
    spec = tmp_path / "study.toml"
    spec.write_text(STUDY)
    study = tmp_path / "S"
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
    }
    cmd = [
        sys.executable, "-m", "orchestrator", "study", "run", str(spec), "--root", str(study),
        "--executor", "ray", "--ray-address", cluster.address,
    ]  # fmt: skip
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "2 done of 2 cells" in proc.stdout, proc.stdout
    for name in ("triviaqa", "sciq"):
        manifest = json.loads((study / "cells" / name / "run_manifest.json").read_text())
        assert manifest["executor"]["kind"] == "ray", manifest["executor"]
        report = json.loads(
            (study / "cells" / name / "consolidated" / "validation_report.json").read_text()
        )
        assert report["ok"], report["problems"]
