"""The embedded server's process keeps scikit-learn (and what it imports) out of its memory,
and loads it as usual should transformers need it."""

from __future__ import annotations

import pathlib
import subprocess
import sys
import textwrap

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]


def run_python(code: str, tmp_path: pathlib.Path) -> str:
    out = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout.strip()


@pytest.mark.fast
def test_transformers_sees_no_sklearn_and_imports_none(tmp_path):
    out = run_python(
        """
        import importlib.util, sys
        from hallulog.serving.unused_packages import keep_out_unused_packages
        print(keep_out_unused_packages())
        from transformers import AutoModelForCausalLM
        from transformers.utils import is_sklearn_available
        print(is_sklearn_available(), importlib.util.find_spec("sklearn"))
        print(sorted(m for m in ("sklearn", "pandas", "pyarrow") if sys.modules.get(m)))
        """,
        tmp_path,
    )
    assert out.splitlines() == ["('sklearn',)", "False None", "[]"]


@pytest.mark.fast
def test_a_transformers_that_needs_sklearn_gets_it(tmp_path):
    (tmp_path / "needs_sklearn.py").write_text("import sklearn\nVERSION = sklearn.__version__\n")
    out = run_python(
        """
        import sys
        from hallulog.serving import unused_packages
        unused_packages._IMPORTERS = ("needs_sklearn",)
        print(unused_packages.keep_out_unused_packages())
        import needs_sklearn, sklearn
        print(needs_sklearn.VERSION == sklearn.__version__)
        """,
        tmp_path,
    )
    assert out.splitlines() == ["()", "True"]


@pytest.mark.fast
def test_an_already_imported_package_is_left_alone(tmp_path):
    out = run_python(
        """
        import sklearn
        from hallulog.serving.unused_packages import keep_out_unused_packages
        print(keep_out_unused_packages(), type(sklearn).__name__)
        """,
        tmp_path,
    )
    assert out == "() module"
