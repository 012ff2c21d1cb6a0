"""The artifact layout: every path under an artifact root, in one place.

```
{artifact_root}/
  run_manifest.json  completed_prompts.json  completions.log  labels.jsonl
  servers/server_{i}.log   spool/server_{i}/   (or --spool-root: run_spool_dir)
  worker_{i}/  prompt_index.jsonl generations.jsonl activation_index.jsonl errors.jsonl activations/
               quarantine.jsonl (repair)  writer.lock
  consolidated/  prompt_index.jsonl generations.jsonl activation_index.jsonl activations/
                 prompts.parquet generations.parquet activation_index.parquet labels.parquet
                 validation_report.json  alignment_audit.json
                 exports/  selfcheck_samples.jsonl semantic_entropy_inputs.jsonl
                           semantic_energy_inputs.jsonl geometry_inputs.jsonl logprob_inputs.jsonl
  evaluation/    report.json report.md *.png

{study_root}/                  (docs/formats/study.md)
  study.json                   the study manifest: its cells, their axis values and run roots
  cells/{name}/                one artifact root per cell
  compare/  table.parquet paired.parquet transfer.parquet report.md *.png   (hallulog compare)
```

Modules that read or write these files take their names from here, never spell them out.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

__all__ = [
    "MANIFEST",
    "CHECKPOINT",
    "COMPLETION_LOG",
    "LABELS",
    "CONSOLIDATED",
    "EXPORTS",
    "EVALUATION",
    "VALIDATION_REPORT",
    "ALIGNMENT_AUDIT",
    "ACTIVATIONS",
    "PROMPT_INDEX",
    "GENERATIONS",
    "ACTIVATION_INDEX",
    "ERRORS",
    "QUARANTINE",
    "WRITER_LOCK",
    "WORKER_JSONL_FILES",
    "CONSOLIDATED_JSONL_FILES",
    "PROMPTS_PARQUET",
    "GENERATIONS_PARQUET",
    "ACTIVATION_INDEX_PARQUET",
    "LABELS_PARQUET",
    "PARQUET_TABLES",
    "SELFCHECK_SAMPLES",
    "SEMANTIC_ENTROPY_INPUTS",
    "SEMANTIC_ENERGY_INPUTS",
    "GEOMETRY_INPUTS",
    "LOGPROB_INPUTS",
    "EXPORT_FILES",
    "REPORT_JSON",
    "REPORT_MD",
    "SCORES",
    "STUDY_MANIFEST",
    "STUDY_CELLS",
    "STUDY_CONFIGS",
    "STUDY_SLURM",
    "STUDY_CELL_LIST",
    "COMPARE",
    "COMPARE_TABLE",
    "COMPARE_PAIRED",
    "COMPARE_TRANSFER",
    "COMPARE_HEATMAPS",
    "ARTIFACT_FILE_NAMES",
    "study_cells_dir",
    "compare_dir",
    "transfer_heatmap",
    "worker_dir",
    "worker_dirs",
    "worker_id_of",
    "consolidated_dir",
    "exports_dir",
    "evaluation_dir",
    "servers_dir",
    "spool_dir",
    "run_spool_dir",
    "activations_dir",
    "ATTENTION",
    "attention_dir",
    "attention_part",
    "worker_attention_file",
]

MANIFEST = "run_manifest.json"
CHECKPOINT = "completed_prompts.json"
COMPLETION_LOG = "completions.log"
LABELS = "labels.jsonl"
CONSOLIDATED = "consolidated"
EXPORTS = "exports"
EVALUATION = "evaluation"
VALIDATION_REPORT = "validation_report.json"
ALIGNMENT_AUDIT = "alignment_audit.json"
"""``consolidated/alignment_audit.json``: the report of ``--validate-only --deep``."""
ACTIVATIONS = "activations"
"""A worker's (or ``consolidated/``'s) activation store directory."""
ATTENTION = "attention"
"""The artifact root's attention summaries (``--attention-features``): one
``part-NNNNNN.safetensors`` per committed batch (docs/formats/attention.md)."""

PROMPT_INDEX = "prompt_index.jsonl"
GENERATIONS = "generations.jsonl"
ACTIVATION_INDEX = "activation_index.jsonl"
ERRORS = "errors.jsonl"
QUARANTINE = "quarantine.jsonl"
"""A worker directory's lines set aside by ``--retry-failed`` repair."""
WRITER_LOCK = "writer.lock"
"""A worker directory's writer lock: held by the one process that appends to it
(contracts/writer_lock.py)."""
WORKER_JSONL_FILES = (PROMPT_INDEX, GENERATIONS, ACTIVATION_INDEX, ERRORS)
"""A worker directory's JSONL files (docs/formats/worker-jsonl.md)."""
CONSOLIDATED_JSONL_FILES = (PROMPT_INDEX, GENERATIONS, ACTIVATION_INDEX)
PROMPTS_PARQUET = "prompts.parquet"
GENERATIONS_PARQUET = "generations.parquet"
ACTIVATION_INDEX_PARQUET = "activation_index.parquet"
LABELS_PARQUET = "labels.parquet"
PARQUET_TABLES = (PROMPTS_PARQUET, GENERATIONS_PARQUET, ACTIVATION_INDEX_PARQUET, LABELS_PARQUET)
"""The consolidated Parquet tables (docs/formats/parquet.md)."""

SELFCHECK_SAMPLES = "selfcheck_samples.jsonl"
SEMANTIC_ENTROPY_INPUTS = "semantic_entropy_inputs.jsonl"
SEMANTIC_ENERGY_INPUTS = "semantic_energy_inputs.jsonl"
GEOMETRY_INPUTS = "geometry_inputs.jsonl"
LOGPROB_INPUTS = "logprob_inputs.jsonl"
EXPORT_FILES = (
    SELFCHECK_SAMPLES,
    SEMANTIC_ENTROPY_INPUTS,
    SEMANTIC_ENERGY_INPUTS,
    GEOMETRY_INPUTS,
    LOGPROB_INPUTS,
)
"""The method exports in ``consolidated/exports/`` (docs/exports.md), in writing order."""

REPORT_JSON = "report.json"
REPORT_MD = "report.md"
SCORES = "scores.parquet"
"""``evaluation/``'s files (``hallulog evaluate``): the report and the per-prompt scores."""

STUDY_MANIFEST = "study.json"
"""A study root's manifest: its cells, their axis values and run roots (docs/formats/study.md)."""
STUDY_CELLS = "cells"
"""A study root's directory of cell run roots (``cells/{name}/``)."""
STUDY_CONFIGS = "configs"
"""A study root's directory of cell run configs (``configs/{name}.toml``, ``run --config``)."""
STUDY_SLURM = "slurm"
"""A study root's directory of what ``study run --executor slurm`` submits (list, logs)."""
STUDY_CELL_LIST = "cells.txt"
"""``slurm/cells.txt``: one cell's config path per line, array task i runs line i + 1."""
COMPARE = "compare"
"""The directory ``hallulog compare`` writes in a study root."""
COMPARE_TABLE = "table.parquet"
COMPARE_PAIRED = "paired.parquet"
COMPARE_TRANSFER = "transfer.parquet"
"""``compare/``'s tables (docs/formats/study.md); its report is ``report.md`` (REPORT_MD)."""
COMPARE_HEATMAPS = {"auroc": "auroc.png", "prr": "prr.png"}
"""``compare/``'s method x cell heatmap of each metric."""

ARTIFACT_FILE_NAMES = frozenset(
    {
        MANIFEST,
        CHECKPOINT,
        COMPLETION_LOG,
        LABELS,
        VALIDATION_REPORT,
        ALIGNMENT_AUDIT,
        *WORKER_JSONL_FILES,
        QUARANTINE,
        WRITER_LOCK,
        *PARQUET_TABLES,
        *EXPORT_FILES,
        REPORT_JSON,
        REPORT_MD,
        SCORES,
        STUDY_MANIFEST,
        STUDY_CELL_LIST,
        COMPARE_TABLE,
        COMPARE_PAIRED,
        COMPARE_TRANSFER,
    }
)
"""Every file name above: no module outside ``contracts/`` spells one out
(tests/test_architecture.py)."""


def worker_dir(artifact_root: str | Path, worker_id: int) -> Path:
    """``{root}/worker_{id}``: one worker's own directory (it alone writes there)."""
    return Path(artifact_root) / f"worker_{worker_id}"


def worker_id_of(path: str | Path) -> int | None:
    """The id of a ``worker_{id}`` directory name, None for any other name."""
    prefix, _, tail = Path(path).name.partition("_")
    return int(tail) if prefix == "worker" and tail.isdigit() else None


def worker_dirs(artifact_root: str | Path) -> list[Path]:
    """Existing ``worker_{i}`` directories, by worker id."""
    found = [
        p
        for p in Path(artifact_root).glob("worker_*")
        if p.is_dir() and worker_id_of(p) is not None
    ]
    return sorted(found, key=lambda p: worker_id_of(p) or 0)


def consolidated_dir(artifact_root: str | Path) -> Path:
    return Path(artifact_root) / CONSOLIDATED


def exports_dir(artifact_root: str | Path) -> Path:
    return consolidated_dir(artifact_root) / EXPORTS


def evaluation_dir(artifact_root: str | Path) -> Path:
    return Path(artifact_root) / EVALUATION


def study_cells_dir(study_root: str | Path) -> Path:
    """``{study}/cells``: the cells' run roots are its sub-directories."""
    return Path(study_root) / STUDY_CELLS


def compare_dir(study_root: str | Path) -> Path:
    """``{study}/compare``: what ``hallulog compare STUDY`` writes."""
    return Path(study_root) / COMPARE


def transfer_heatmap(method: str) -> str:
    """``compare/``'s transfer matrix heatmap of one probe."""
    return f"transfer_{method}.png"


def activations_dir(directory: str | Path) -> Path:
    """The activation store of a worker directory or of ``consolidated/``."""
    return Path(directory) / ACTIVATIONS


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


def spool_dir(
    artifact_root: str | Path, server_index: int, spool_root: str | Path | None = None
) -> Path:
    """Where server ``server_index`` writes capture files for the workers to pick up."""
    return run_spool_dir(artifact_root, spool_root) / f"server_{server_index}"


def attention_dir(artifact_root: str | Path) -> Path:
    """``<root>/attention/``: the attention summaries (docs/formats/attention.md)."""
    return Path(artifact_root) / ATTENTION


def attention_part(index: int) -> str:
    """The file name of attention part ``index``."""
    return f"part-{index:06d}.safetensors"


def worker_attention_file(worker_dir: str | Path, prompt_id: str, sample_id: int) -> Path:
    """``worker_{i}/attention/<hash>.safetensors``: one generation's attention summaries
    captured during generation (the embedded server's), kept by its worker until the run
    stores them in ``attention/`` parts (docs/formats/attention.md); the name is a hash of
    ``(prompt_id, sample_id)``."""
    import hashlib

    key = hashlib.sha256(f"{prompt_id}\0{sample_id}".encode()).hexdigest()[:32]
    return Path(worker_dir) / ATTENTION / f"{key}.safetensors"
