"""``orchestrator evaluate`` and the alignment audit on a bfloat16 store (a bf16 model's run)."""

from __future__ import annotations

import json
import shutil

import numpy as np
from hallulog.cli.app import main
from hallulog.evaluation.audit import audit_alignment
from hallulog.storage import SampleMeta, open_store, open_writer
from hallulog.storage.dtypes import BFLOAT16, to_float32

from tests.evaluation.synthetic import make_run

PROBES = [
    "got_logistic_last",
    "got_massmean_last",
    "sep_tbg",
    "lkm_exact_answer",
    "se_discrete_exact",
]
FAST = ["--no-embeddings", "--no-plots", "--bootstrap", "50", "--methods", *PROBES]


def _widen_store(root) -> None:
    """Replace the run's bfloat16 store by float32 holding exactly the same values."""
    cons = root / "consolidated"
    src = open_store(cons)
    w = open_writer("packed", root / "wide", src.layer_ids, src.hidden_size, "float32")
    for i in range(len(src)):
        m = src.meta(i)
        w.write(
            m["sample_key"],
            to_float32(src.read_sample(i)),
            SampleMeta(m["prompt_len"], m["response_len"], m["label"]),
        )
    w.close()
    src.close()
    shutil.rmtree(cons / "activations")
    shutil.move(root / "wide" / "activations", cons / "activations")


def test_probes_read_bfloat16_exactly(tmp_path):
    """The probes' float32 features from a bfloat16 store are its exact widening: the report
    equals the one of a float32 store holding the same values."""
    bf = make_run(tmp_path / "bf", n=40, dtype="bfloat16")
    assert open_store(bf / "consolidated").dtype == BFLOAT16
    wide = tmp_path / "wide"
    shutil.copytree(bf, wide)
    _widen_store(wide)
    assert open_store(wide / "consolidated").dtype == np.float32
    reports = []
    for root in (bf, wide):
        assert main(["evaluate", "--artifact-root", str(root), *FAST]) == 0
        reports.append(json.loads((root / "evaluation" / "report.json").read_text()))
    got, want = reports
    assert got["per_layer"] == want["per_layer"] and set(got["per_layer"]) == set(PROBES) - {
        "se_discrete_exact"
    }
    assert {m: r["auroc"] for m, r in got["methods"].items()} == {
        m: r["auroc"] for m, r in want["methods"].items()
    }
    assert got["methods"]["got_logistic_last"]["auroc"] > 0.8  # the synthetic signal survives bf16


def test_alignment_audit_on_a_bfloat16_store(tmp_path):
    """Layer-0 rows of a bfloat16 store equal the embedding matrix rounded to bfloat16."""
    result = audit_alignment(make_run(tmp_path / "run", n=12, dtype="bfloat16"))
    assert result["ok"] and result["mode"] == "embedding" and result["max_rel_error"] == 0.0
