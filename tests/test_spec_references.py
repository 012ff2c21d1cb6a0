"""Every citation of a source spec ("seed" + number, optionally "§" + section) in the repository
has a heading in docs/spec.md, and every section heading there is cited somewhere.

Citations are matched case-insensitively in every tracked text file (``git ls-files``; without
git, a walk of the repository that skips hidden and cache directories). A trailing full stop is
not part of a section number. docs/spec.md's own text does not count as citing its headings.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SPEC = REPO / "docs" / "spec.md"

# "seed" + three digits, then optionally " §" + a dotted section number.
CITATION = re.compile(r"\bseed (\d{3})(?: §(\d+(?:\.\d+)*))?", re.IGNORECASE)
HEADING = re.compile(r"^(#{2,6}) (.*)$")
_SKIP_DIRS = {
    ".git",
    ".venv",
    "venv",
    "__pycache__",
    "node_modules",
    ".pytest_cache",
    ".hypothesis",
    "build",
    "dist",
}


def _key(seed: str, section: str | None) -> str:
    return f"seed {seed}" + (f" §{section}" if section else "")


def tracked_files() -> list[Path]:
    try:
        out = subprocess.run(
            ["git", "ls-files", "-z"], cwd=REPO, capture_output=True, check=True
        ).stdout.decode()
        return [REPO / p for p in out.split("\0") if p]
    except (OSError, subprocess.CalledProcessError):
        found = []
        for path in REPO.rglob("*"):
            rel = path.relative_to(REPO).parts
            if path.is_file() and not any(p in _SKIP_DIRS or p.startswith(".") for p in rel[:-1]):
                found.append(path)
        return found


def citations() -> dict[str, list[str]]:
    """citation key → ["file:line", ...] over every tracked text file but docs/spec.md."""
    out: dict[str, list[str]] = {}
    for path in tracked_files():
        if path == SPEC or not path.is_file():
            continue
        try:
            text = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue  # binary file
        for lineno, line in enumerate(text.splitlines(), start=1):
            for m in CITATION.finditer(line):
                out.setdefault(_key(m.group(1), m.group(2)), []).append(
                    f"{path.relative_to(REPO)}:{lineno}"
                )
    return out


def spec_headings() -> dict[str, int]:
    """heading key ("seed NNN" or "seed NNN §x") → line number in docs/spec.md.

    A spec heading is ``## seed NNN — title`` or ``### seed NNN §x — title`` (the key, then
    nothing or an em dash and a title).
    """
    out: dict[str, int] = {}
    for lineno, line in enumerate(SPEC.read_text(encoding="utf-8").splitlines(), start=1):
        h = HEADING.match(line)
        if not h:
            continue
        m = CITATION.match(h.group(2))
        if not m:
            continue
        rest = h.group(2)[m.end() :]
        assert rest == "" or rest.startswith(" — "), (
            f"docs/spec.md:{lineno}: a seed heading is 'seed NNN[ §x]' then ' — title', "
            f"got {line!r}"
        )
        key = _key(m.group(1), m.group(2))
        assert key not in out, f"docs/spec.md:{lineno}: {key} also at line {out[key]}"
        out[key] = lineno
    return out


def test_the_scan_finds_citations():
    found = citations()
    assert len(found) >= 10 and sum(map(len, found.values())) >= 50, found


def test_every_citation_has_a_spec_heading():
    headings = spec_headings()
    dangling = [
        f"{where}: '{key}'"
        for key, wheres in sorted(citations().items())
        for where in wheres
        if key.lower() not in headings
    ]
    assert not dangling, (
        "citations without a heading in docs/spec.md (add one, or fix the "
        "citation):\n" + "\n".join(dangling)
    )


def test_every_section_heading_is_cited():
    cited = {k.lower() for k in citations()}
    uncited = [
        f"docs/spec.md:{line}: {key}"
        for key, line in spec_headings().items()
        if "§" in key and key not in cited
    ]
    assert not uncited, "section headings nobody cites (remove them or cite them):\n" + "\n".join(
        uncited
    )


def test_every_seed_has_a_top_level_heading():
    headings = spec_headings()
    for seed in ("000", "001", "002", "003", "004"):
        assert f"seed {seed}" in headings, f"docs/spec.md lacks '## seed {seed} — …'"
    for key in headings:
        if "§" in key:
            assert key.split(" §")[0] in headings, f"{key} has no top-level seed heading"


# ---- what these pages name exists ---------------------------------------------------------------

OWN_DOCS = [
    SPEC,
    REPO / "docs" / "formats" / "worker-jsonl.md",
    REPO / "docs" / "formats" / "consolidated-jsonl.md",
]
_PACKAGES = (
    "api|bench|contracts|docs|orchestrator|serving|storage|tests|workers|scripts|hallulog_vllm"
)
REPO_PATH = re.compile(rf"(?<![\w./{{}}-])((?:{_PACKAGES})/[\w./-]*\w)")
PY_NAME = re.compile(r"`((?:contracts|orchestrator|storage|workers|serving|api)(?:\.\w+)+)")


def _resolves(dotted: str) -> bool:
    import importlib

    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for attr in parts[cut:]:
            if not hasattr(obj, attr):
                return False
            obj = getattr(obj, attr)
        return True
    return False


def test_named_paths_and_python_names_exist():
    """Every repository path (``exports/saev.py``) and dotted Python name
    (``hallulog.workers.persist.recover_worker_dir``) these pages mention exists."""
    missing = []
    for doc in OWN_DOCS:
        text = doc.read_text(encoding="utf-8")
        for lineno, line in enumerate(text.splitlines(), start=1):
            where = f"{doc.relative_to(REPO)}:{lineno}"
            missing += [f"{where}: {p}" for p in REPO_PATH.findall(line) if not (REPO / p).exists()]
            missing += [f"{where}: {n}" for n in PY_NAME.findall(line) if not _resolves(n)]
    assert not missing, "named but not in the repository:\n" + "\n".join(missing)
