"""study.json: written atomically, read back, unknown keys kept, bad manifests one line."""

from __future__ import annotations

import json

import pytest
from hallulog.study.manifest import STUDY_VERSION, load_study, make_cell, write_study
from hallulog.study.naming import StudyError


def _doc(tmp_path):
    return json.loads((tmp_path / "study.json").read_text())


def test_written_cells_read_back(tmp_path):
    cells = [
        make_cell({"model": "m", "task": {"task": "nq_open"}}, fingerprint="ab" * 32),
        make_cell({"model": "m", "task": {"task": "sciq"}}),
    ]
    write_study(tmp_path, cells, source={"path": "study.toml", "sha256": "0" * 64})
    doc = _doc(tmp_path)
    assert doc["study_version"] == STUDY_VERSION and doc["axes"] == ["model", "task"]
    assert doc["cells"][0] == {
        "name": "m__nq_open",
        "values": {"model": "m", "task": {"task": "nq_open"}},
        "root": "cells/m__nq_open",
        "fingerprint": "ab" * 32,
    }
    study = load_study(tmp_path)
    assert [c.name for c in study.cells] == ["m__nq_open", "m__sciq"]
    assert study.cells[1].path(tmp_path) == tmp_path / "cells" / "m__sciq"
    assert study.source["path"] == "study.toml"
    assert not list(tmp_path.glob("*.partial"))


def test_unknown_keys_survive_a_rewrite(tmp_path):
    write_study(tmp_path, [make_cell({"seed": 0})])
    doc = _doc(tmp_path)
    doc["created_by"] = "a newer hallulog"
    doc["cells"][0]["status_hint"] = "done"
    (tmp_path / "study.json").write_text(json.dumps(doc))
    study = load_study(tmp_path)
    write_study(tmp_path, list(study.cells), extra=study.extra)
    again = _doc(tmp_path)
    assert again["created_by"] == "a newer hallulog"
    assert again["cells"][0]["status_hint"] == "done"


@pytest.mark.parametrize(
    "change,message",
    [
        (lambda d: d.update(study_version=STUDY_VERSION + 1), "newer than this hallulog reads"),
        (lambda d: d.pop("cells"), "lacks `cells`"),
        (lambda d: d["cells"][0].update(root="/abs/path"), "must be a path inside"),
        (lambda d: d["cells"][0].update(root="../elsewhere"), "must be a path inside"),
        (lambda d: d["cells"][0].update(name="Bad Name"), "not a cell name"),
        (lambda d: d["cells"][0].pop("fingerprint"), r"cells\[0\] lacks `fingerprint`"),
        (lambda d: d["cells"].append(dict(d["cells"][0])), "two cells are named"),
        (lambda d: d["cells"][0]["values"].update(temperature=1), "values must be an object"),
    ],
)
def test_bad_manifests_are_one_line_naming_the_file(tmp_path, change, message):
    write_study(tmp_path, [make_cell({"seed": 0})])
    doc = _doc(tmp_path)
    change(doc)
    (tmp_path / "study.json").write_text(json.dumps(doc))
    with pytest.raises(StudyError, match=message) as info:
        load_study(tmp_path)
    assert "study.json" in str(info.value) and "\n" not in str(info.value)


def test_a_directory_without_a_manifest_says_what_to_do(tmp_path):
    with pytest.raises(StudyError, match="no study.json.*--out DIR"):
        load_study(tmp_path)


def test_malformed_json_names_file_and_line(tmp_path):
    (tmp_path / "study.json").write_text('{\n  "study_version": 1,\n  oops\n}')
    with pytest.raises(Exception, match=r"study.json:3: malformed study manifest"):
        load_study(tmp_path)
