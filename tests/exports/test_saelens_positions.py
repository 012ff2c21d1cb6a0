"""The SAELens export's token ids follow ``token_positions`` in a run with named positions
(docs/alignment.md)."""

import json

import pytest
from hallulog.exports.saelens import ConsolidatedTokenIds
from hallulog.storage.errors import ManifestError


def _write(root, act):
    (root / "prompt_index.jsonl").write_text(
        json.dumps({"prompt_id": "p", "prompt_token_ids": [10, 11, 12]}) + "\n"
    )
    (root / "generations.jsonl").write_text(
        json.dumps({"prompt_id": "p", "sample_id": 0, "token_ids": [20, 21, 22, 23]}) + "\n"
    )
    (root / "activation_index.jsonl").write_text(
        json.dumps({"prompt_id": "p", "sample_id": 0, "activation_key": "p_0", **act}) + "\n"
    )


def test_rows_follow_token_positions(tmp_path):
    _write(tmp_path, {"row0_position": 2, "num_rows": 3, "token_positions": [2, 4, 5]})
    assert ConsolidatedTokenIds(str(tmp_path)).rows("p_0", 3).tolist() == [12, 21, 22]


def test_contiguous_rows_without_token_positions(tmp_path):
    _write(tmp_path, {"row0_position": 2, "num_rows": 3})
    assert ConsolidatedTokenIds(str(tmp_path)).rows("p_0", 3).tolist() == [12, 20, 21]


def test_token_positions_past_the_ids_are_refused(tmp_path):
    _write(tmp_path, {"row0_position": 2, "num_rows": 2, "token_positions": [2, 9]})
    with pytest.raises(ManifestError, match="token_positions"):
        ConsolidatedTokenIds(str(tmp_path)).rows("p_0", 2)
