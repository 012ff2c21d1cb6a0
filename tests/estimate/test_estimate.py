"""``estimate`` against what runs really store, the free-space refusal and ``--max-storage-gb``.

The runs go through ``python -m orchestrator``'s ``main`` in this process, against the bench's
instant backend (canned 12-token answers, random hidden states, 48-token prompts): no model.
"""

from __future__ import annotations

import collections
import json
import logging
import shutil
from pathlib import Path

import pytest
from hallulog.cli.app import main
from hallulog.estimate import projection as est_mod
from hallulog.estimate.measure import Lengths, tree_bytes
from hallulog.orchestrator.run import budget

REPO = Path(__file__).resolve().parents[2]
NUM_LAYERS, HIDDEN = 4, 512
ANSWER_TOKENS = 12  # the instant backend's canned answer length (max_tokens below is more)


@pytest.fixture(scope="module")
def backends(instant_backend_module):
    """``backend(num_layer_ids)`` → URL of an instant backend capturing that many layers."""
    started: dict[int, str] = {}

    def backend(num_layer_ids: int) -> str:
        if num_layer_ids not in started:
            started[num_layer_ids] = instant_backend_module(
                num_layer_ids=num_layer_ids,
                hidden_size=HIDDEN,
                answer_tokens=ANSWER_TOKENS,
                served_model_name="fake-model",
                quiet=True,
            )
        return started[num_layer_ids]

    return backend


@pytest.fixture(scope="module")
def study(tmp_path_factory) -> dict[str, Path]:
    """A fake model directory (config.json only) and a TriviaQA file of 40 questions."""
    base = tmp_path_factory.mktemp("study")
    model = base / "fake-model"
    model.mkdir()
    (model / "config.json").write_text(
        json.dumps({"num_hidden_layers": NUM_LAYERS, "hidden_size": HIDDEN})
    )
    task = base / "questions.jsonl"
    with open(task, "w") as f:
        for i in range(40):
            value = "Paris" if i % 2 else "Rome"
            f.write(
                json.dumps(
                    {
                        "QuestionId": f"q{i:04d}",
                        "Question": f"Which city is {i}?",
                        "Answer": {"Value": value, "Aliases": [value]},
                    }
                )
                + "\n"
            )
    return {"model": model, "task": task}


@pytest.fixture(autouse=True)
def _fresh_logging():
    """``main`` binds log handlers to the stderr of its first call: drop them after each test
    (capsys gives every test its own stream)."""
    loggers = [logging.getLogger(), logging.getLogger("orchestrator.startup")]
    before = [list(lg.handlers) for lg in loggers]
    yield
    for lg, handlers in zip(loggers, before):
        lg.handlers[:] = handlers


def _flags(root: Path, study: dict[str, Path], url: str, *extra: str) -> list[str]:
    return [
        "--artifact-root",
        str(root),
        "--task",
        "triviaqa",
        "--task-path",
        str(study["task"]),
        "--model",
        str(study["model"]),
        "--manage-servers",
        "false",
        "--server-urls",
        url,
        "--k-samples",
        "3",
        "--max-tokens",
        "16",
        "--progress",
        "false",
        *extra,
    ]


def _estimate(capsys, *args: str) -> dict:
    capsys.readouterr()
    assert main(["estimate", *args, "--json"]) == 0
    out = capsys.readouterr().out.strip().splitlines()
    assert len(out) == 1, out
    return json.loads(out[0])


def _store_bytes(root: Path) -> int:
    """``du -sb worker_*/activations``."""
    return sum(tree_bytes(d / "activations") for d in root.glob("worker_*"))


@pytest.mark.slow
def test_fixed_selection_is_exact_against_a_run(tmp_path, study, backends, capsys):
    url = backends(2)  # light: second_half of 4 layers = ids 3, 4; one row (last)
    root = tmp_path / "run"
    flags = _flags(root, study, url, "--logging-profile", "light", "--limit", "12")
    est = _estimate(capsys, *flags)
    assert est["basis"] == "exact" and est["layers"] == 2
    assert est["rows_per_generation"]["upper_bound"] == 1
    assert est["prompts"] == 12 and est["generations"] == 48
    assert main(["run", *flags]) == 0
    actual = _store_bytes(root)
    assert abs(est["total_bytes"] - actual) / actual < 0.05, (est["total_bytes"], actual)
    # the data alone is exact to the byte; the rest is the store's index (a few hundred bytes
    # a sample plus its fixed files)
    assert est["total_bytes"] - 48 * est["overhead_bytes_per_generation"] == 48 * 2 * HIDDEN * 2


@pytest.mark.slow
def test_response_mode_from_a_pilot_matches_the_run(tmp_path, study, backends, capsys):
    url = backends(NUM_LAYERS + 1)  # integrated: every layer id, the response rows
    pilot = tmp_path / "pilot"
    assert main(["run", *_flags(pilot, study, url, "--limit", "3")]) == 0
    root = tmp_path / "run"
    flags = _flags(root, study, url, "--limit", "10")
    bound = _estimate(capsys, *flags)
    assert bound["basis"] == "upper_bound"
    assert bound["rows_per_generation"] == {"upper_bound": 16, "expected": None}
    est = _estimate(capsys, *flags, "--from-run", str(pilot))
    assert est["basis"] == "pilot" and est["rows_per_generation"]["expected"] == ANSWER_TOKENS
    assert est["lengths"]["response_mean"] == ANSWER_TOKENS
    assert est["metadata_basis"] == "pilot" and est["rate_generations_per_s"] > 0
    # every canned answer has 12 tokens: no spread between the pilot's prompts
    assert est["pilot_prompts"] == 3
    assert est["expected_range_total_bytes"] == [est["total_bytes"]] * 2
    assert main(["run", *flags]) == 0
    actual = _store_bytes(root)
    assert abs(est["total_bytes"] - actual) / actual < 0.05, (est["total_bytes"], actual)


def test_json_line_keys_and_model_shapes(capsys):
    light = _estimate(
        capsys, "--model-shape", "32:4096", "--logging-profile", "light", "--limit", "10"
    )
    for key in (
        "bytes_per_generation",
        "total_bytes",
        "generations",
        "prompts",
        "layers",
        "rows_per_generation",
        "basis",
        "upper_bound_bytes_per_generation",
        "expected_bytes_per_generation",
        "metadata_bytes_per_generation",
        "projected_bytes",
        "free_bytes",
        "fits",
        "seconds",
    ):
        assert key in light, key
    assert light["layers"] == 16 and light["basis"] == "exact"
    assert light["prompts"] == 10 and light["generations"] == 60
    assert light["bytes_per_generation"] == 16 * 4096 * 2 + light["overhead_bytes_per_generation"]
    assert light["total_bytes"] == 60 * light["bytes_per_generation"]
    probes = _estimate(
        capsys,
        "--model-shape",
        "32:4096",
        "--layers",
        "8,16,24,-1",
        "--positions",
        "tbg,slt,exact_answer,last",
        "--limit",
        "10",
        "--mean-prompt-tokens",
        "40",
        "--mean-response-tokens",
        "64",
        "--mean-answer-tokens",
        "3",
        "--rate",
        "2",
    )
    # generation capture: slt and last are the same row; tbg + 3 answer tokens + that row
    assert probes["rows_per_generation"] == {"upper_bound": 64, "expected": 5}
    assert probes["basis"] == "pilot" and probes["layer_ids"] == [8, 16, 24, 32]
    assert probes["seconds"] == 30.0
    full = _estimate(
        capsys,
        "--model-shape",
        "30:576",
        "--logging-profile",
        "full",
        "--limit",
        "5",
        "--mean-prompt-tokens",
        "40",
        "--mean-response-tokens",
        "64",
    )
    assert full["rows_per_generation"]["expected"] == 40 + 64 - 1
    assert full["lengths"]["prompt_mean"] == 40 and full["lengths"]["prompt_source"] == "bytes"
    assert full["rows_per_generation"]["upper_bound"] > 40 + 64 - 1  # the task's longest prompt
    capsys.readouterr()
    assert main(["estimate", "--model-shape", "32"]) == 2
    assert "--model-shape" in capsys.readouterr().err


def test_selection_rows_by_name():
    sel = est_mod.Selection((1, 2), ("first:4", "tbg"), "float16", "generation")
    assert sel.fixed and sel.rows(50, 64, 0) == 5 and sel.rows(50, 2, 0) == 2
    assert est_mod.Selection((1,), ("response",), "float16", "prefill").rows(50, 10, 0) == 11
    assert est_mod.Selection((1,), ("all",), "float16", "generation").rows_at_mean(
        40.5, 10.0, 0
    ) == pytest.approx(49.5)


def test_the_expected_range_comes_from_the_spread_between_prompts():
    sel = est_mod.Selection((0, 1), ("response",), "float16", "generation")
    lengths = Lengths(
        samples=((9, 10, 0), (9, 10, 0), (9, 30, 0), (9, 30, 0)),
        prompt_of=(0, 0, 1, 1),
        source="pilot",
    )
    est = est_mod.project(
        sel,
        hidden_size=8,
        storage_format="packed",
        max_tokens=64,
        k_samples=1,
        prompts=1000,
        lengths=lengths,
    )
    assert est.rows_expected == 20 and est.pilot_prompts == 2
    # per-prompt means 10 and 30: sd 14.1 rows, two standard errors ~20 rows at k = 2
    lo, hi = est.expected_range
    assert lo < est.bytes_expected < hi
    assert (hi - lo) / 2 == pytest.approx(
        2 * 14.142 * (1 / 2 + 1 / 1000) ** 0.5 * 2 * 8 * 2, rel=1e-2
    )  # the commit line grows a digit
    assert est.pilot_prompts_for_10_percent == 200  # (2 * 14.14 / 2.0) ** 2


@pytest.mark.slow
def test_run_refuses_a_projection_over_the_free_space(
    tmp_path, study, backends, capsys, monkeypatch
):
    url = backends(NUM_LAYERS + 1)
    root = tmp_path / "run"
    real = shutil.disk_usage
    monkeypatch.setattr(shutil, "disk_usage", lambda p: real(p)._replace(free=100_000))
    capsys.readouterr()
    assert main(["run", *_flags(root, study, url, "--limit", "4")]) == 1
    err = [x for x in capsys.readouterr().err.splitlines() if x.startswith("error: ")]
    assert len(err) == 1, err
    assert "not enough free space" in err[0] and "100 kB free" in err[0]
    assert "--check-free-space false" in err[0] and "upper bound" in err[0]
    assert not list(root.glob("worker_*"))  # nothing ran
    assert (
        main(["run", *_flags(root, study, url, "--limit", "4"), "--check-free-space", "false"]) == 0
    )


@pytest.mark.slow
def test_storage_cap_stops_cleanly_and_resumes(tmp_path, study, backends, capsys, monkeypatch):
    url = backends(NUM_LAYERS + 1)
    monkeypatch.setattr(budget, "STORAGE_CHECK_SECONDS", 0.0)  # measure after every event
    root = tmp_path / "run"
    flags = _flags(root, study, url, "--groups-in-flight", "1")
    capsys.readouterr()
    assert main(["run", *flags, "--max-storage-gb", "0.001"]) == 130
    err = capsys.readouterr().err
    assert "storage cap reached:" in err and "--max-storage-gb 0.001" in err, err
    assert "raise the cap and rerun to resume" in err
    done = json.loads((root / "completed_prompts.json").read_text())
    assert 0 < done["count"] < 40
    # a rerun at the same cap stops before starting anything
    assert main(["run", *flags, "--max-storage-gb", "0.001"]) == 130
    assert "storage cap reached" in capsys.readouterr().err
    assert main(["run", *flags, "--max-storage-gb", "1"]) == 0
    out = capsys.readouterr().out
    assert "validation OK" in out and "40/40 prompts done" in out, out
    keys = [
        json.loads(line)["activation_key"]
        for line in (root / "consolidated" / "activation_index.jsonl").read_text().splitlines()
    ]
    assert len(keys) == 40 * 4 and not [k for k, n in collections.Counter(keys).items() if n > 1]


def test_storage_meter_walks_at_most_every_interval(tmp_path):
    now = [0.0]
    meter = budget.StorageMeter(tmp_path, 1e-6, min_interval=5.0, clock=lambda: now[0])
    meter.poll()  # 0 bytes: under the cap of 1000 bytes
    (tmp_path / "a.bin").write_bytes(b"x" * 2000)
    now[0] = 4.0
    meter.poll()  # not due yet: no walk
    assert meter.stored == 0
    now[0] = 5.0
    with pytest.raises(budget.StorageCapReached, match=r"2e-06 GB >= --max-storage-gb 1e-06"):
        meter.poll()
