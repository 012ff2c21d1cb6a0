"""Missing optional packages: one line with the install command, at the point of use.

Each case runs in a fresh interpreter where the package is made unimportable
(``sys.modules[name] = None``), through the real entry point that needs it.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from hallulog.contracts.extras import (
    EXTRAS,
    MissingExtra,
    install_command,
    require,
    require_installed,
)

REPO = Path(__file__).resolve().parents[2]


def _without(module: str, code: str) -> subprocess.CompletedProcess:
    prelude = f"import sys\nsys.modules[{module!r}] = None\n"
    return subprocess.run(
        [sys.executable, "-c", prelude + textwrap.dedent(code)],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=120,
    )


def test_ray_executor_without_ray_names_the_extra():
    proc = _without(
        "ray",
        """
        from hallulog.orchestrator.run.ray_executor import connect
        try:
            connect("local")
        except Exception as exc:
            print(type(exc).__name__, "|", exc)
    """,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == (
        "MissingExtra | --executor ray needs the Python package 'ray', "
        "which is not installed: pip install 'hallulog[ray]'"
    )


def test_cli_study_file_without_pyyaml_is_one_line(tmp_path):
    study = tmp_path / "study.yaml"
    study.write_text("k_samples: 2\n")
    proc = _without(
        "yaml",
        f"""
        from hallulog.cli.app import main
        sys.exit(main(["run", "--config", {str(study)!r}, "--artifact-root",
                       {str(tmp_path / "root")!r}]))
    """,
    )
    assert proc.returncode != 0
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, proc.stderr
    assert "needs the Python package 'yaml'" in lines[0]
    assert "pip install 'hallulog[dev]'" in lines[0] and str(study) in lines[0]


def test_vllm_backend_checked_before_any_server_starts():
    proc = _without(
        "vllm",
        """
        from hallulog.contracts.extras import require_installed
        try:
            require_installed("vllm", "--backend vllm")
        except Exception as exc:
            print(exc)
    """,
    )
    assert proc.stdout.strip().startswith("--backend vllm needs the Python package 'vllm'")
    assert "pip install 'hallulog[vllm]'" in proc.stdout


def test_require_returns_the_module_and_keeps_real_import_errors(tmp_path, monkeypatch):
    assert require("json", "x").dumps([1]) == "[1]"
    # a present package that fails while importing is not disguised as "not installed"
    (tmp_path / "broken_pkg_xyz.py").write_text("import no_such_dependency_abc\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ModuleNotFoundError, match="no_such_dependency_abc"):
        require("broken_pkg_xyz", "x")
    with pytest.raises(MissingExtra, match=r"pip install not-there-pkg"):
        require("not_there_pkg", "x")
    with pytest.raises(MissingExtra):
        require_installed("not_there_pkg", "x")


def test_every_extra_line_is_a_pip_command():
    for module in EXTRAS:
        assert install_command(module).startswith("pip install "), module
