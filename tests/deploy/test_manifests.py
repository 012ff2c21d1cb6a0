"""Every file in deploy/ is parsed and checked: required fields, and the hallulog command each one
runs is accepted by the real CLI parser (``hallulog.cli.app.build_parser``).

The Slurm scripts are executed for real with a stub in place of Python (and of ``sbatch`` for
submit.sh), so the check sees the exact argv they would run, not a regex over their text.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
from pathlib import Path

import pytest
import tomllib
import yaml
from hallulog.cli.app import build_parser
from packaging.requirements import Requirement
from packaging.version import Version

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"


def parse_hallulog(argv: list[str]):
    """``python -m orchestrator ARGS`` → the parsed namespace (SystemExit fails the test)."""
    i = argv.index("-m")
    assert argv[i + 1] == "orchestrator", argv
    return build_parser().parse_args(argv[i + 2 :])


def _dockerfile(name: str) -> dict[str, list[str]]:
    text = (DEPLOY / name).read_text().replace("\\\n", " ")
    out: dict[str, list[str]] = {}
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            out.setdefault(word.upper(), []).append(rest.strip())
    return out


@pytest.mark.parametrize(
    "name, base", [("Dockerfile.gpu", "vllm/vllm-openai"), ("Dockerfile.cpu", "python:3.11")]
)
def test_dockerfiles(name, base):
    d = _dockerfile(name)
    froms = d["FROM"]
    assert len(froms) == 1
    args = dict(a.split("=", 1) for a in d.get("ARG", []) if "=" in a)
    image = froms[0].replace("${VLLM_IMAGE}", args.get("VLLM_IMAGE", ""))
    assert image.startswith(base)
    entry, cmd = json.loads(d["ENTRYPOINT"][0]), json.loads(d["CMD"][0])
    ns = parse_hallulog(entry + cmd)
    assert ns.command == "run" and str(ns.artifact_root).startswith("/artifacts")
    assert "/artifacts" in d["VOLUME"][0]
    run = " ".join(d["RUN"])
    if name == "Dockerfile.gpu":
        assert ns.backend == "vllm"
        assert "--no-deps" in run and "torch" in run  # keeps the image's CUDA torch
        assert "ray" in run  # --executor ray needs Ray in the image
        # the image's vLLM is a checked one: a tag in the vllm extra's range, checked at build
        assert "scripts/vllm_api_check.py check" in run
        extra = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
        (spec,) = extra["optional-dependencies"]["vllm"]
        assert Version(image.rpartition(":v")[2]) in Requirement(spec).specifier
    else:
        assert "scripts/setup.sh" in run and "default_model_dir" in run


def _stub(tmp_path: Path, name: str, body: str) -> Path:
    path = tmp_path / "bin" / name
    path.parent.mkdir(exist_ok=True)
    path.write_text("#!/usr/bin/env bash\n" + body)
    path.chmod(0o755)
    return path


def _argv_of(script: str, tmp_path: Path, **env: str) -> list[str]:
    record = tmp_path / "argv"
    python = _stub(tmp_path, "python", f'printf "%s\\n" "$@" > {record}\n')
    full = {
        "PATH": os.environ["PATH"],
        "PYTHON": str(python),
        "HALLULOG_DIR": str(REPO),
        "OUT": str(tmp_path / "out"),
        **env,
    }
    proc = subprocess.run(
        ["bash", str(DEPLOY / "slurm" / script)],
        env=full,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert proc.returncode == 0, proc.stderr
    return record.read_text().splitlines()


def test_slurm_shard_script_runs_one_shard(tmp_path):
    argv = _argv_of(
        "shard.sbatch",
        tmp_path,
        SLURM_ARRAY_TASK_ID="1",
        SHARDS="3",
        RUN_ARGS="--limit 6 --k-samples 1",
        BASE_PORT="9400",
        HALLULOG_GPUS="0,1",
    )
    ns = parse_hallulog(argv)
    assert ns.command == "run" and ns.shard == "1/3" and ns.limit == 6 and ns.gpus == (0, 1)
    assert ns.artifact_root == tmp_path / "out" / "shard_1_of_3"
    assert ns.server_base_port == 9410
    cpu = parse_hallulog(_argv_of("shard.sbatch", tmp_path, SLURM_ARRAY_TASK_ID="0", SHARDS="3"))
    assert cpu.gpus is None and cpu.shard == "0/3"


def test_slurm_merge_script_merges_every_shard(tmp_path):
    ns = parse_hallulog(_argv_of("merge.sbatch", tmp_path, SHARDS="3"))
    assert ns.command == "merge" and ns.out == tmp_path / "out" / "merged"
    assert ns.shard_roots == [tmp_path / "out" / f"shard_{i}_of_3" for i in range(3)]


@pytest.mark.parametrize("gpus", ["8", "0"])
def test_slurm_submit_queues_the_array_then_the_merge_afterok(tmp_path, gpus):
    log = tmp_path / "sbatch.log"
    sbatch = _stub(
        tmp_path, "sbatch", f'echo "$*" >> {log}\nn=$(wc -l < {log}); echo "$((41 + n));cluster"\n'
    )
    env = {
        "PATH": f"{sbatch.parent}:{os.environ['PATH']}",
        "SHARDS": "3",
        "GPUS_PER_NODE": gpus,
        "OUT": str(tmp_path / "out"),
        "HALLULOG_DIR": str(REPO),
    }
    proc = subprocess.run(
        ["bash", str(DEPLOY / "slurm" / "submit.sh")],
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert proc.returncode == 0, proc.stderr
    array, merge = [shlex.split(line) for line in log.read_text().splitlines()]
    assert "--array=0-2" in array and array[-1].endswith("shard.sbatch")
    assert ("--gres=gpu:8" in array) == (gpus == "8")
    assert "--dependency=afterok:42" in merge and merge[-1].endswith("merge.sbatch")
    assert "job 42" in proc.stdout and "job 43" in proc.stdout


def _sbatch_directives(script: str) -> list[str]:
    return [
        line.split(None, 1)[1]
        for line in (DEPLOY / "slurm" / script).read_text().splitlines()
        if line.startswith("#SBATCH")
    ]


@pytest.mark.parametrize("script", ["shard.sbatch", "merge.sbatch", "submit.sh"])
def test_slurm_scripts_are_valid_bash_with_settings_on_top(script):
    subprocess.run(["bash", "-n", str(DEPLOY / "slurm" / script)], check=True)
    text = (DEPLOY / "slurm" / script).read_text()
    assert "# ---- settings" in text.split("set -euo pipefail", 1)[1][:200]
    if script.endswith(".sbatch"):
        directives = _sbatch_directives(script)
        assert any(d.startswith("--job-name=") for d in directives)
        assert all(d.startswith("--") for d in directives)


def test_kuberay_rayjob():
    docs = list(yaml.safe_load_all((DEPLOY / "k8s" / "rayjob.yaml").read_text()))
    assert len(docs) == 1
    job = docs[0]
    assert job["apiVersion"] == "ray.io/v1" and job["kind"] == "RayJob"
    spec = job["spec"]
    ns = parse_hallulog(shlex.split(spec["entrypoint"]))
    assert ns.command == "run" and ns.executor == "ray" and ns.ray_address == "auto"
    assert spec["shutdownAfterJobFinishes"] is True
    cluster = spec["rayClusterSpec"]
    head = cluster["headGroupSpec"]
    assert isinstance(head["rayStartParams"], dict)
    groups = cluster["workerGroupSpecs"]
    assert groups and all(
        {"groupName", "replicas", "rayStartParams", "template"} <= set(g) for g in groups
    )
    pvcs = {
        d["metadata"]["name"]: d
        for d in yaml.safe_load_all((DEPLOY / "k8s" / "pvc.yaml").read_text())
    }
    assert pvcs["hallulog-artifacts"]["spec"]["accessModes"] == ["ReadWriteMany"]
    for pod in [head["template"]["spec"]] + [g["template"]["spec"] for g in groups]:
        claims = {
            v["name"]: v["persistentVolumeClaim"]["claimName"]
            for v in pod["volumes"]
            if "persistentVolumeClaim" in v
        }
        assert set(claims.values()) <= set(pvcs)
        (container,) = pod["containers"]
        assert container["image"]
        mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
        # the shared artifact volume is where the run writes, on the driver and every actor
        assert str(ns.artifact_root).startswith(mounts["artifacts"] + "/")
    for g in groups:  # one actor per GPU: one GPU per worker pod
        limits = g["template"]["spec"]["containers"][0]["resources"]["limits"]
        assert str(limits["nvidia.com/gpu"]) == "1"


def test_slurm_study_script_runs_its_line_of_the_cell_list(tmp_path):
    cells = tmp_path / "cells.txt"
    cells.write_text("/s/configs/a.toml\n/s/configs/b.toml\n")
    argv = _argv_of(
        "study.sbatch", tmp_path, SLURM_ARRAY_TASK_ID="1", CELL_LIST=str(cells), BASE_PORT="9400"
    )
    i = argv.index("-m")
    assert argv[i + 1] == "hallulog.orchestrator", argv  # the installed package, any directory
    ns = build_parser().parse_args(argv[i + 2 :])
    assert ns.command == "run" and ns.config == Path("/s/configs/b.toml")
    assert ns.server_base_port == 9410 and ns.progress is False and ns.gpus is None
    record = tmp_path / "argv"
    record.unlink()
    proc = subprocess.run(
        ["bash", str(DEPLOY / "slurm" / "study.sbatch")],
        env={"PATH": os.environ["PATH"], "SLURM_ARRAY_TASK_ID": "2", "CELL_LIST": str(cells)},
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert proc.returncode == 2 and f"no line 3 in {cells}" in proc.stderr
