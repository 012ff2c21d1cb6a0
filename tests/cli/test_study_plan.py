"""``study run``'s planning: a study file's cells built as RunConfigs, planned before anything
starts (a bad value is one line naming the cell), written as ``run --config`` files that read
back to the same config and fingerprint; the commands the executors run; ``study status``."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
from hallulog.cli.study_plan import plan_study, write_cells
from hallulog.cli.study_run import cell_command, run_cells, slurm_command
from hallulog.cli.study_status import cell_state, format_status, study_status
from hallulog.config.config_file import load_study as load_config_file
from hallulog.config.run_config import RunConfig
from hallulog.contracts import layout
from hallulog.contracts.root_lock import root_lock
from hallulog.study import load_study
from hallulog.study.naming import StudyError

STUDY = """\
limit = 6
k_samples = 2
max_tokens = 8

[axes]
tasks = [{task = "triviaqa"}, {task = "nq_open", task_path = "data/nq.jsonl"}]
prompts = [{name = "plain"}, {name = "terse", system_prompt = "Answer in a few words."}]
"""
REPO = Path(__file__).resolve().parents[2]
NAMES = ["triviaqa__plain", "triviaqa__terse", "nq_open-nq__plain", "nq_open-nq__terse"]


def _file(tmp_path: Path, text: str = STUDY) -> Path:
    path = tmp_path / "in" / "study.toml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def test_cells_are_configs_under_the_study_root(tmp_path):
    study = plan_study(_file(tmp_path), tmp_path / "S", plan=False)
    assert [pc.name for pc in study.cells] == NAMES
    assert study.axes == ("task", "prompt")
    nq = study.cells[2].config
    assert nq.task == "nq_open" and nq.limit == 6 and nq.k_samples == 2
    assert nq.task_path == str(tmp_path / "in" / "data" / "nq.jsonl")  # against the file's dir
    assert study.cells[1].config.system_prompt == "Answer in a few words."
    assert study.cells[0].config.system_prompt is None
    for pc in study.cells:
        assert Path(pc.config.artifact_root) == (tmp_path / "S" / "cells" / pc.name).absolute()
        assert pc.config.extra["study_cell"] == pc.name


def test_written_configs_read_back_to_the_same_config(tmp_path):
    study = plan_study(_file(tmp_path), tmp_path / "S", plan=False)
    write_cells(study)
    manifest = load_study(tmp_path / "S")
    assert [c.name for c in manifest.cells] == NAMES
    assert manifest.source["sha256"] == study.sha256
    for pc, cell in zip(study.cells, manifest.cells, strict=True):
        assert cell.config == f"configs/{pc.name}.toml"
        values = load_config_file(tmp_path / "S" / cell.config).values
        again = RunConfig(**values)
        assert again.fingerprint_fields() == pc.config.fingerprint_fields()
        assert again.artifact_root == pc.config.artifact_root


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        (
            STUDY.replace('{task = "triviaqa"}', '{task = "nosuchtask"}'),
            "cell nosuchtask__plain: task = 'nosuchtask': expected one of",
        ),
        (
            STUDY.replace('name = "terse",', 'name = "terse", k_samples = -1,'),
            "cell triviaqa__terse: ",
        ),
        (STUDY.replace("limit = 6", "limit = 'six'"), "limit = 'six': expected an integer"),
        (STUDY.replace("limit = 6", "artifact_root = 'x'"), "`artifact_root` is set by the study"),
        (
            STUDY.replace('{task = "triviaqa"}', '{task = "triviaqa", shard = "0/2"}'),
            "cell triviaqa-37562f57__plain: `shard` is set by the study",
        ),
        (
            STUDY.replace('name = "terse",', 'name = "terse", k_sampels = 3,'),
            "cell triviaqa__terse: unknown key 'k_sampels' (did you mean 'k_samples'?)",
        ),
    ],
)
def test_a_bad_value_is_one_line_naming_the_cell(tmp_path, text, needle):
    with pytest.raises(StudyError) as err:
        plan_study(_file(tmp_path, text), tmp_path / "S", plan=False)
    msg = str(err.value)
    assert needle in msg and "\n" not in msg, msg
    assert not (tmp_path / "S").exists()  # nothing written


def test_a_layer_the_model_lacks_names_the_cell_before_anything_starts(tmp_path):
    text = STUDY.replace('{name = "terse", ', '{name = "terse", layers = "99", ')
    with pytest.raises(StudyError) as err:
        plan_study(_file(tmp_path, text), tmp_path / "S")
    msg = str(err.value)
    assert "cell triviaqa__terse:" in msg and "99" in msg and "\n" not in msg, msg
    assert not (tmp_path / "S").exists()


@pytest.mark.slow  # the model resolved twice (a subprocess each, ~1.6 s)
def test_planned_fingerprint_is_the_one_of_the_written_config(tmp_path):
    from hallulog.backends.models import hallulog_cache_dir, resolve_model
    from hallulog.config.plan import plan_run

    text = STUDY.replace('{task = "nq_open", task_path = "data/nq.jsonl"}', '{task = "sciq"}')
    study = plan_study(_file(tmp_path, text), tmp_path / "S")
    write_cells(study)
    fps = {pc.cell.fingerprint for pc in study.cells}
    assert len(fps) == 4 and None not in fps
    model = None
    for cell in load_study(tmp_path / "S").cells:
        config = RunConfig(**load_config_file(tmp_path / "S" / cell.config).values)
        model = model or resolve_model(config.model, hallulog_cache_dir(config.cache_dir))
        assert plan_run(config, model).manifest["config_fingerprint"] == cell.fingerprint


@pytest.mark.parametrize(
    "example", sorted((REPO / "examples" / "studies").glob("*.toml")), ids=lambda p: p.name
)
def test_example_studies_parse(example, tmp_path):
    """Every example study's cells are built (not planned, not run) and listed in its README."""
    study = plan_study(example, tmp_path / "S", plan=False)
    assert study.cells and all(isinstance(pc.config, RunConfig) for pc in study.cells)
    assert f"studies/{example.name}" in (REPO / "examples" / "README.md").read_text()


def test_executor_commands(tmp_path):
    study = plan_study(_file(tmp_path), tmp_path / "S", overrides={"executor": "ray"}, plan=False)
    write_cells(study)
    pc = study.cells[0]
    values = load_config_file(tmp_path / "S" / pc.cell.config).values
    assert values["executor"] == "ray"  # each cell's run uses the run's Ray executor
    cmd = cell_command(study, pc, python="py")
    assert cmd == [
        "py", "-m", "hallulog.cli.study_cell", str(os.getpid()), "run", "--config",
        str(tmp_path / "S" / "configs" / "triviaqa__plain.toml"),
    ]  # fmt: skip
    sb = slurm_command(study, list(study.cells[1:]), Path("x.sbatch"), ["--partition=gpu"])
    assert sb[1:3] == ["--parsable", "--array=0-2"]
    assert f"CELL_LIST={(tmp_path / 'S').absolute()}/slurm/cells.txt" in sb[4]
    assert f"PYTHON={sys.executable}" in sb[4]
    assert sb[-2:] == ["--partition=gpu", "x.sbatch"]


def test_status_of_each_cell(tmp_path):
    study = plan_study(_file(tmp_path), tmp_path / "S", plan=False)
    write_cells(study)
    roots = [pc.cell.path(study.root) for pc in study.cells]
    # done: consolidated; failed: started, not held; running: a live holder; pending: nothing
    (roots[0] / "consolidated").mkdir(parents=True)
    (roots[0] / "consolidated" / layout.VALIDATION_REPORT).write_text("{}")
    for r in roots[:3]:
        r.mkdir(parents=True, exist_ok=True)
        (r / layout.MANIFEST).write_text(json.dumps({"run_id": "r", "total_prompts": 6}))
    with root_lock(roots[2], "run"):
        states = [cell_state(r) for r in roots]
        entries = study_status(tmp_path / "S")
    assert states == ["done", "failed", "running", "pending"]
    assert [e["state"] for e in entries] == states
    assert entries[1]["total"] == 6 and entries[1]["done"] == 0
    text = format_status(entries)
    assert "1 pending, 1 running, 1 done, 1 failed of 4 cells" in text


def test_run_cells_goes_on_after_a_failed_cell_and_stops_when_interrupted(tmp_path, capsys):
    """The executor's bookkeeping with a stand-in for the cell's process (a shell script whose
    exit status the cell's config file names): done cells are skipped, a failed cell does not
    stop the next, an interrupted one (exit 130) stops the study."""
    text = STUDY.replace("[axes]", "[axes]\nseeds = [0, 1, 2]")
    study = plan_study(_file(tmp_path, text), tmp_path / "S", plan=False)
    write_cells(study)
    done = study.cells[0].cell.path(study.root)
    (done / "consolidated").mkdir(parents=True)
    (done / "consolidated" / layout.VALIDATION_REPORT).write_text("{}")
    fake = tmp_path / "fake.sh"
    fake.write_text(
        '#!/bin/sh\ncase "$6" in *seed1.toml) exit 1;; *terse__seed2.toml) exit 130;; esac\n'
    )
    fake.chmod(0o755)
    outcomes = run_cells(study, python=str(fake))
    states = [(o.name, o.state) for o in outcomes]
    assert states[:3] == [
        ("triviaqa__plain__seed0", "skipped"),
        ("triviaqa__plain__seed1", "failed"),
        ("triviaqa__plain__seed2", "failed"),  # exit 0 but not consolidated: not done
    ]
    assert states[-1] == ("triviaqa__terse__seed2", "interrupted") and len(states) == 6
    assert "triviaqa__plain__seed1: failed (exit 1)" in capsys.readouterr().err
