"""The artifact layout: every path under an artifact root, in one place.

```
{artifact_root}/
  run_manifest.json  completed_prompts.json  completions.log  labels.jsonl
  servers/server_{i}.log   spool/server_{i}/   (or --spool-root: run_spool_dir)
  worker_{i}/  prompt_index.jsonl generations.jsonl activation_index.jsonl errors.jsonl activations/
  consolidated/  prompt_index.jsonl generations.jsonl activation_index.jsonl activations/
                 prompts.parquet generations.parquet activation_index.parquet labels.parquet
                 exports/  validation_report.json
  evaluation/    report.json report.md *.png
```

Modules that read or write these files take their names from here, never spell them out.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

__all__ = [
    "MANIFEST", "CHECKPOINT", "COMPLETION_LOG", "LABELS", "CONSOLIDATED", "EXPORTS",
    "EVALUATION", "VALIDATION_REPORT", "PROMPT_INDEX", "GENERATIONS", "ACTIVATION_INDEX",
    "ERRORS", "WORKER_JSONL_FILES", "CONSOLIDATED_JSONL_FILES", "PARQUET_TABLES", "worker_dir",
    "worker_dirs", "worker_id_of", "consolidated_dir", "exports_dir", "evaluation_dir",
    "servers_dir", "spool_dir", "run_spool_dir",
]

MANIFEST = "run_manifest.json"
CHECKPOINT = "completed_prompts.json"
COMPLETION_LOG = "completions.log"
LABELS = "labels.jsonl"
CONSOLIDATED = "consolidated"
EXPORTS = "exports"
EVALUATION = "evaluation"
VALIDATION_REPORT = "validation_report.json"

PROMPT_INDEX = "prompt_index.jsonl"
GENERATIONS = "generations.jsonl"
ACTIVATION_INDEX = "activation_index.jsonl"
ERRORS = "errors.jsonl"
WORKER_JSONL_FILES = (PROMPT_INDEX, GENERATIONS, ACTIVATION_INDEX, ERRORS)
"""A worker directory's JSONL files (docs/formats/worker-jsonl.md)."""
CONSOLIDATED_JSONL_FILES = (PROMPT_INDEX, GENERATIONS, ACTIVATION_INDEX)
PARQUET_TABLES = ("prompts.parquet", "generations.parquet", "activation_index.parquet",
                  "labels.parquet")
"""The consolidated Parquet tables (docs/formats/parquet.md)."""


def worker_dir(artifact_root: str | Path, worker_id: int) -> Path:
    """``{root}/worker_{id}``: one worker's own directory (it alone writes there)."""
    return Path(artifact_root) / f"worker_{worker_id}"


def worker_id_of(path: str | Path) -> int | None:
    """The id of a ``worker_{id}`` directory name, None for any other name."""
    prefix, _, tail = Path(path).name.partition("_")
    return int(tail) if prefix == "worker" and tail.isdigit() else None


def worker_dirs(artifact_root: str | Path) -> list[Path]:
    """Existing ``worker_{i}`` directories, by worker id."""
    found = [p for p in Path(artifact_root).glob("worker_*")
             if p.is_dir() and worker_id_of(p) is not None]
    return sorted(found, key=lambda p: worker_id_of(p) or 0)


def consolidated_dir(artifact_root: str | Path) -> Path:
    return Path(artifact_root) / CONSOLIDATED


def exports_dir(artifact_root: str | Path) -> Path:
    return consolidated_dir(artifact_root) / EXPORTS


def evaluation_dir(artifact_root: str | Path) -> Path:
    return Path(artifact_root) / EVALUATION


def servers_dir(artifact_root: str | Path) -> Path:
    """Server logs and pid files."""
    return Path(artifact_root) / "servers"


def run_spool_dir(artifact_root: str | Path, spool_root: str | Path | None = None) -> Path:
    """The directory of a run's server spools: ``spool/`` in the artifact root, or, with
    ``--spool-root``, a directory of its own there named after the artifact root (two runs
    sharing one spool root, e.g. ``/dev/shm``, never clear each other's files; a resumed run
    finds its own)."""
    if spool_root is None:
        return Path(artifact_root) / "spool"
    digest = hashlib.sha256(os.fsencode(Path(artifact_root).resolve())).hexdigest()[:16]
    return Path(spool_root) / f"hallulog-spool-{digest}"


def spool_dir(artifact_root: str | Path, server_index: int,
              spool_root: str | Path | None = None) -> Path:
    """Where server ``server_index`` writes capture files for the workers to pick up."""
    return run_spool_dir(artifact_root, spool_root) / f"server_{server_index}"
