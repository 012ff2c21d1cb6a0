"""Roots the explorer cannot show: one line naming what to run."""

from __future__ import annotations

import shutil

import pytest
from hallulog.contracts import layout
from hallulog.view.run_files import ViewInputError, open_run_files


def test_no_directory(tmp_path):
    with pytest.raises(ViewInputError, match="no such directory"):
        open_run_files(tmp_path / "absent")


def test_no_consolidated(tmp_path):
    with pytest.raises(ViewInputError) as exc:
        open_run_files(tmp_path)
    assert f"run `hallulog consolidate --artifact-root {tmp_path}`" in str(exc.value)
    assert "\n" not in str(exc.value)


def test_no_parquet_tables(synthetic_run, tmp_path):
    root = tmp_path / "run"
    shutil.copytree(synthetic_run, root)
    (layout.consolidated_dir(root) / layout.GENERATIONS_PARQUET).unlink()
    with pytest.raises(ViewInputError, match="generations.parquet is missing.*consolidate"):
        open_run_files(root)


def test_an_imported_run_is_named(tmp_path):
    import json

    layout.consolidated_dir(tmp_path).mkdir()
    (tmp_path / layout.MANIFEST).write_text(json.dumps({"imported": True, "model": "m"}))
    with pytest.raises(ViewInputError, match="is an imported run .hallulog import.: it has no"):
        open_run_files(tmp_path)


def test_no_evaluation_opens_and_says_what_to_run(unevaluated_run):
    files = open_run_files(unevaluated_run)
    assert files.scores is None and files.report is None and files.plots == {}
    assert files.evaluation_missing == (
        f"{unevaluated_run} has no evaluation (report.json, scores.parquet): run "
        f"`hallulog evaluate --artifact-root {unevaluated_run}` for detector scores, "
        "rankings and plots"
    )


def test_malformed_report_names_the_file(synthetic_run, tmp_path):
    root = tmp_path / "run"
    shutil.copytree(synthetic_run, root)
    (layout.evaluation_dir(root) / layout.REPORT_JSON).write_text("{not json")
    with pytest.raises(Exception, match=r"report.json:1: malformed evaluation report"):
        open_run_files(root)


def test_a_truncated_table_is_one_line(synthetic_run, tmp_path):
    from hallulog.view.index import QuestionIndex

    root = tmp_path / "run"
    shutil.copytree(synthetic_run, root)
    path = layout.consolidated_dir(root) / layout.PROMPTS_PARQUET
    path.write_bytes(path.read_bytes()[:1000])
    with pytest.raises(ViewInputError) as exc:
        QuestionIndex(open_run_files(root))
    assert str(exc.value).startswith(f"{root}: its Parquet tables cannot be read (")
    assert "\n" not in str(exc.value) and "hallulog consolidate" in str(exc.value)
