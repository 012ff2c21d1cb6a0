"""``hallulog compare``: outputs in STUDY/compare, loose run roots with --out, one-line errors."""

from __future__ import annotations

import pytest
from hallulog.cli.app import main

from tests.study.conftest import BOOT


def test_a_study_compares_into_its_compare_dir(synthetic_study, tmp_path, capsys):
    assert (
        main(
            [
                "compare",
                str(synthetic_study),
                "--no-plots",
                "--bootstrap",
                str(BOOT),
                "--no-transfer",
            ]
        )
        == 0
    )
    out = capsys.readouterr()
    assert "3 of 5 cells compared" in out.out
    assert "skipped synthetic__seed3: no run root" in out.err
    files = {p.name for p in (synthetic_study / "compare").iterdir()}
    assert {"table.parquet", "paired.parquet", "report.md"} <= files
    assert "transfer.parquet" not in files  # --no-transfer leaves none (nor a former one)


def test_run_roots_need_out_and_compare_into_it(synthetic_study, tmp_path, capsys):
    cells = synthetic_study / "cells"
    roots = [str(cells / "synthetic__seed0"), str(cells / "synthetic__seed1")]
    assert main(["compare", *roots, "--no-plots", "--bootstrap", "20", "--no-transfer"]) == 1
    assert capsys.readouterr().err.strip() == (
        "hallulog compare: error: run roots need --out DIR (where the comparison is written)"
    )
    assert (
        main(
            [
                "compare",
                "--out",
                str(tmp_path / "c"),
                *roots,
                "--no-plots",
                "--bootstrap",
                "20",
                "--methods",
                "logprob",
            ]
        )
        == 0
    )
    assert "2 of 2 cells compared" in capsys.readouterr().out
    assert (tmp_path / "c" / "table.parquet").is_file()


@pytest.mark.parametrize(
    "args,message",
    [
        (["{run}"], "holds no study.json: to compare run roots give --out DIR"),
        (["--out", "{tmp}/o", "{tmp}/missing"], "missing: no such run root"),
        (["--out", "{tmp}/o", "{run}", "{study}"], "is a study root: give it alone"),
        (["{study}", "--methods", "nonsense"], "--methods: unknown method 'nonsense'"),
    ],
)
def test_bad_input_is_one_line(synthetic_study, tmp_path, capsys, args, message):
    run = synthetic_study / "cells" / "synthetic__seed0"
    argv = [a.format(run=run, tmp=tmp_path, study=synthetic_study) for a in args]
    assert main(["compare", *argv]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("hallulog compare: error: ") and message in err


@pytest.mark.parametrize("flag,value", [("--folds", "1"), ("--bootstrap", "-3"), ("--seed", "x")])
def test_bad_flags_exit_2_with_one_line(synthetic_study, capsys, flag, value):
    with pytest.raises(SystemExit) as info:
        main(["compare", str(synthetic_study), flag, value])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and flag in err
