"""A study root of synthetic cells (tests/evaluation/synthetic.py: the real writer, real JSONL,
real exports), evaluated in-process, and compared once."""

from __future__ import annotations

from pathlib import Path

import pytest
from hallulog.evaluation.cli import write_outputs
from hallulog.evaluation.evaluate import evaluate
from hallulog.study import compare, make_cell, study_cells, write_study

from tests.evaluation.synthetic import make_run

#: the methods every evaluated synthetic cell scores (fast: text and the last-row probes)
METHODS = ["logprob", "geometry"]
BOOT = 50

#: name -> (axis values, make_run keywords or None (absent), evaluated)
CELLS = {
    "synthetic__seed0": ({"model": "synthetic", "seed": 0}, {}, True),
    "synthetic__seed1": (
        {"model": "synthetic", "seed": 1},
        {"labels": [(j // 3) % 2 for j in range(40)]},
        True,
    ),
    # another layer shape (a different model for the probes) and other prompts
    "synthetic-3l__seed0": (
        {"model": {"model": "synthetic", "name": "synthetic-3l"}, "seed": 0},
        {"layers": (0, 1, 2), "dataset": "other"},
        True,
    ),
    "synthetic__seed2": ({"model": "synthetic", "seed": 2}, {}, False),
    "synthetic__seed3": ({"model": "synthetic", "seed": 3}, None, False),
}


def evaluate_cell(root: Path) -> None:
    report = evaluate(root, methods=METHODS, embeddings=False, n_boot=BOOT)
    write_outputs(report, root / "evaluation", plots=False)


@pytest.fixture(scope="session")
def synthetic_study(tmp_path_factory) -> Path:
    """STUDY/study.json + cells/<name>/: three evaluated cells, one finished but not
    evaluated, one not run."""
    study = tmp_path_factory.mktemp("study")
    cells = []
    for name, (values, kwargs, evaluated) in CELLS.items():
        cell = make_cell(values, fingerprint=None)
        assert cell.name == name
        cells.append(cell)
        if kwargs is None:
            continue
        root = make_run(cell.path(study), n=40, k=2, seed=0, **kwargs)
        if evaluated:
            evaluate_cell(root)
    write_study(study, cells)
    return study


@pytest.fixture(scope="session")
def compared(synthetic_study):
    """``compare`` over the synthetic study (no plots), into STUDY/compared (the CLI test writes
    the default STUDY/compare)."""
    _, cells = study_cells(synthetic_study)
    return compare(cells, synthetic_study / "compared", n_boot=BOOT, plots=False)
