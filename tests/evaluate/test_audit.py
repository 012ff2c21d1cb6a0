"""The alignment audit catches a planted one-position shift and a swap of two prompts."""

from __future__ import annotations

from orchestrator.evaluate import run_deep_audit
from orchestrator.evaluate.audit import audit_alignment

from .synthetic import _pid, make_run


def test_clean_run_passes(tmp_path):
    result = audit_alignment(make_run(tmp_path / "run", n=12))
    assert result["ok"], result["mismatches"]
    assert result["mode"] == "embedding" and result["checked"] == 12 * 4
    assert result["rows_checked"] == 12 * 4 * 4


def test_shift_is_caught(tmp_path):
    result = audit_alignment(make_run(tmp_path / "run", n=12, plant=("shift", 5)))
    assert not result["ok"]
    assert [m["activation_key"] for m in result["mismatches"]] == [f"{_pid(5)}_0"]
    m = result["mismatches"][0]
    assert m["num_bad_rows"] >= 2 and m["decoded_token_ids"] != m["expected_token_ids"]


def test_swap_is_caught(tmp_path, capsys):
    root = make_run(tmp_path / "run", n=12, plant=("swap", 2, 7))
    result = run_deep_audit(root)
    assert not result["ok"]
    assert {m["activation_key"] for m in result["mismatches"]} == {f"{_pid(2)}_0", f"{_pid(7)}_0"}
    assert "MISALIGNED" in capsys.readouterr().out
    assert (root / "consolidated" / "alignment_audit.json").is_file()
