"""What ``pip install hallulog`` puts on a machine (docs/architecture.md, "One import namespace").

The wheel is built from a copy of the checkout's files (as a fresh clone has them) with the
build backend already installed (``pip wheel --no-deps --no-build-isolation``: no download).
Its import names are ``hallulog``, the vLLM plugin and the ``orchestrator`` entry module only;
every package folder of a room is in it (pyproject's ``packages`` list is kept by hand: this is
what keeps it honest), with its data files; and installing hallulog keeps the torch an
environment already has (the core dependencies hold only a floor)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import zipfile
from importlib import metadata
from pathlib import Path

import pytest
import tomllib

from tests.test_self_contained import repository_files

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))
SETUPTOOLS = PYPROJECT["tool"]["setuptools"]
TOP_LEVEL = {"hallulog", "hallulog_vllm", "orchestrator"}


@pytest.fixture(scope="module")
def source(tmp_path_factory) -> Path:
    """The checkout's files (tracked, and new ones git does not ignore) in a fresh folder."""
    src = tmp_path_factory.mktemp("clone") / "hallulog"
    for path in repository_files():
        if path.is_file():
            target = src / path.relative_to(REPO)
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(path, target)
    return src


@pytest.fixture(scope="module")
def wheel(source, tmp_path_factory) -> zipfile.ZipFile:
    out = tmp_path_factory.mktemp("wheel")
    cmd = [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation"]
    subprocess.run(
        [*cmd, "-w", str(out), str(source)], check=True, capture_output=True, timeout=300
    )
    (built,) = out.glob("hallulog-*.whl")
    return zipfile.ZipFile(built)


def _files(wheel: zipfile.ZipFile) -> list[str]:
    return [n for n in wheel.namelist() if ".dist-info/" not in n]


def _package_folders() -> dict[str, Path]:
    """Installed package name → its folder, for every folder with an ``__init__.py`` under a
    room of pyproject's package-dir mapping, the face (hallulog/) and the plugin."""
    roots = {name: REPO / folder for name, folder in SETUPTOOLS["package-dir"].items()}
    roots |= {"hallulog": REPO / "hallulog", "hallulog_vllm": REPO / "hallulog_vllm"}
    found = {}
    for name, root in roots.items():
        for init in root.rglob("__init__.py"):
            if "__pycache__" not in init.parts:
                rel = init.parent.relative_to(root).parts
                found[".".join([name, *rel])] = init.parent
    return found


def test_the_wheel_installs_three_import_names(wheel):
    tops = {n.split("/")[0] for n in _files(wheel)}
    assert tops == TOP_LEVEL
    (top_level,) = [n for n in wheel.namelist() if n.endswith(".dist-info/top_level.txt")]
    assert set(wheel.read(top_level).decode().split()) == TOP_LEVEL


def test_orchestrator_is_the_entry_module_only(wheel):
    """``python -m orchestrator run``: its ``__init__`` and ``__main__``, nothing else (the room
    itself is ``hallulog.orchestrator``)."""
    assert sorted(n for n in _files(wheel) if n.startswith("orchestrator/")) == [
        "orchestrator/__init__.py",
        "orchestrator/__main__.py",
    ]
    main = (REPO / "orchestrator" / "__main__.py").read_text(encoding="utf-8")
    assert "hallulog.cli" in main and "from hallulog.orchestrator" not in main


def test_every_package_folder_is_in_the_wheel(wheel):
    folders = _package_folders()
    assert set(SETUPTOOLS["packages"]) == set(folders) | {"orchestrator"}
    names = set(_files(wheel))
    missing = []
    for package, folder in folders.items():
        prefix = package.replace(".", "/")
        for module in folder.glob("*.py"):
            if f"{prefix}/{module.name}" not in names:
                missing.append(f"{prefix}/{module.name}")
    assert missing == []


def _data_patterns(package: str) -> list[str]:
    data = SETUPTOOLS["package-data"]
    return list(data.get("*", [])) + list(data.get(package, []))


def test_the_package_data_is_in_the_wheel(wheel):
    """Each package's data files: the globs of pyproject's package-data, as setuptools reads
    them (relative to the package's folder)."""
    expected = {
        f"{package.replace('.', '/')}/{path.relative_to(folder).as_posix()}"
        for package, folder in _package_folders().items()
        for pattern in _data_patterns(package)
        for path in folder.glob(pattern)
        if path.is_file()
    }
    assert "hallulog/api/dashboard.html" in expected
    assert any(n.startswith("hallulog/tasks/data/judge_prompts/") for n in expected)
    assert len([n for n in expected if n.startswith("hallulog/tasks/data/")]) >= 15
    assert sorted(expected - set(_files(wheel))) == []


def test_the_entry_points(wheel):
    (entry,) = [n for n in wheel.namelist() if n.endswith(".dist-info/entry_points.txt")]
    text = wheel.read(entry).decode()
    assert "hallulog = hallulog.cli:main" in text
    assert "[vllm.general_plugins]" in text and "hallulog_vllm.plugin:register" in text


def test_the_core_dependencies_hold_a_torch_floor_only():
    (torch,) = [
        d for d in PYPROJECT["project"]["dependencies"] if d.split(">")[0].strip() == "torch"
    ]
    assert torch.replace(" ", "").startswith("torch>=") and "<" not in torch and "==" not in torch


def test_an_install_keeps_the_torch_it_finds(source, tmp_path):
    """``pip install -e .`` into this environment (whose torch is not PyPI's newest) would
    install nothing new, torch least of all: every dependency is met, the floor included."""
    report = tmp_path / "report.json"
    cmd = [sys.executable, "-m", "pip", "install", "--dry-run", "--no-build-isolation", "-q"]
    cmd += ["--report", str(report), "-e", str(source)]
    subprocess.run(cmd, check=True, capture_output=True, timeout=300)
    planned = {i["metadata"]["name"].lower() for i in json.loads(report.read_text())["install"]}
    assert planned == {"hallulog"}, planned
    assert metadata.version("torch")  # the torch in place, which the plan leaves as it is
