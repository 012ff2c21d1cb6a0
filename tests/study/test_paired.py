"""The paired bootstrap between cells: one cell's resamples reused over its pairs equals each
pair computed afresh (``paired_differences`` with each cell's labels), NaN scores included."""

from __future__ import annotations

import numpy as np
from hallulog.evaluation.metrics import paired_differences
from hallulog.evaluation.scores import ScoreTable, write_scores
from hallulog.study.cells import CellRef
from hallulog.study.paired import paired_rows, shared_pairs
from hallulog.study.table import open_cell_scores


def _cell(tmp_path, name, ids, seed, nan_at=()):
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, 2, len(ids))
    score = labels + rng.normal(0, 1.0, len(ids))
    score[list(nan_at)] = np.nan
    root = tmp_path / name
    write_scores(
        ScoreTable(
            prompt_ids=list(ids),
            labels=labels,
            fold=np.zeros(len(ids), np.int64),
            test=np.ones(len(ids), bool),
            scores={"m": score, "other": rng.normal(size=len(ids))},
            n_boot=60,
        ),
        root / "evaluation" / "scores.parquet",
    )
    return open_cell_scores(CellRef(name, root, {}))


def test_reused_resamples_equal_fresh_pairs(tmp_path):
    ids = [f"{i:016x}" for i in range(57)] + ["frage-ä", "问题", "q|3"]  # imported runs: any id
    cells = [
        _cell(tmp_path, "x", ids, 1),
        _cell(tmp_path, "y", ids[::-1], 2),  # same prompts, another order
        _cell(tmp_path, "z", ids, 3, nan_at=(4, 9)),  # NaN scores: its pairs drop two prompts
        _cell(tmp_path, "w", ids[30:] + [f"{i:016x}" for i in range(100, 130)], 4),  # half shared
        _cell(tmp_path, "v", [f"{i:016x}" for i in range(200, 260)], 5),  # none shared
    ]
    rows = list(paired_rows(cells, ["m", "other"], seed=7, n_boot=60))
    pairs = {(r["cell_a"], r["cell_b"]) for r in rows}
    assert pairs == {
        (a, b) for a, b in [("x", "y"), ("x", "z"), ("y", "z"), ("x", "w"), ("y", "w"), ("z", "w")]
    }
    assert len(shared_pairs(cells)) == 6
    for r in rows:
        a, b = (next(c for c in cells if c.name == n) for n in (r["cell_a"], r["cell_b"]))
        common = np.intersect1d(a.test_ids, b.test_ids)
        ia = [int(np.flatnonzero(a.test_ids == p)[0]) for p in common]
        ib = [int(np.flatnonzero(b.test_ids == p)[0]) for p in common]
        sa, sb = a.column(r["method"])[ia], b.column(r["method"])[ib]
        want = paired_differences(a.labels[ia], sa, sb, labels_b=b.labels[ib], n_boot=60, seed=7)
        assert r["n"] == want["n"]
        for metric in ("auroc", "prr"):
            d = want[metric]
            got = [
                r[f"{metric}_diff"],
                r[f"{metric}_diff_lo"],
                r[f"{metric}_diff_hi"],
                r[f"{metric}_p_le_0"],
            ]
            assert got == [d["diff"], *d["ci95"], d["p_le_0"]]
    assert next(r for r in rows if (r["cell_a"], r["cell_b"]) == ("x", "z"))["n"] == 58
    assert next(r for r in rows if (r["cell_a"], r["cell_b"]) == ("x", "w"))["n"] == 30
