"""``run_manifest.json`` as one frozen value: loaded once, read with its defaults, dumped whole.

```python
from hallulog.contracts.run_manifest import RunManifest
m = RunManifest.load(root)               # None when the root has no manifest
m.storage_format                         # "packed" when the file does not say (DEFAULTS)
m = m.replace(consolidated=True)         # a new value; unknown keys and key order kept
m.dump(root)                             # atomic rewrite, byte-identical for an unchanged value
```

The file is the seed 003 §6.1 fields, the config fingerprint and versions (written by
``config/manifest.py``). Keys this module does not know are kept as they are (forward
compatibility): a newer hallulog's manifest survives a rewrite by an older one. The schema
version is ``manifest_version``; a file without it is version 1 (every manifest written so far),
and a file from a newer version than :data:`MANIFEST_VERSION` is refused with one line.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

from hallulog.contracts import layout
from hallulog.contracts.errors import ArtifactError, ResumeRefused
from hallulog.contracts.jsonl import read_document

__all__ = [
    "RunManifest",
    "MANIFEST_VERSION",
    "DEFAULTS",
    "DEFAULT_STORAGE_FORMAT",
    "check_resumable",
]

MANIFEST_VERSION = 1
"""The newest ``manifest_version`` this code reads (absent in the file: 1)."""

DEFAULT_STORAGE_FORMAT = "packed"
"""The activation store of a run: ``--storage-format``'s default, and a manifest's without one."""

DEFAULTS: Mapping[str, Any] = MappingProxyType(
    {
        "manifest_version": 1,
        "storage_format": DEFAULT_STORAGE_FORMAT,
        "activations_subdir": layout.ACTIVATIONS + "/",
        "completed_prompt_ids": (),
        "shard": None,
        "positions": None,
    }
)
"""What a manifest that lacks a key means by it: the one place a reader's default lives."""


@dataclass(frozen=True)
class RunManifest(Mapping[str, Any]):
    """One run's manifest: the whole JSON object (``fields``), read-only, in file order.

    A :class:`~collections.abc.Mapping` over the file's own keys; :meth:`get` and the properties
    fall back to :data:`DEFAULTS` for a key the file lacks.
    """

    fields: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "fields", MappingProxyType(dict(self.fields)))

    # ------------------------------------------------------------------------ reading, writing

    @staticmethod
    def path(artifact_root: str | Path) -> Path:
        return Path(artifact_root) / layout.MANIFEST

    @classmethod
    def load(cls, artifact_root: str | Path) -> RunManifest | None:
        """The manifest of the run at ``artifact_root``; None when it has none.

        A file that is not a JSON object, not UTF-8, or from a newer manifest version is an
        :class:`~hallulog.contracts.errors.ArtifactError` naming it (and the line, for bad JSON).
        """
        path = cls.path(artifact_root)
        if not path.exists():
            return None
        data = read_document(path, "manifest")
        if not isinstance(data, dict):
            raise ArtifactError(f"{path}: malformed manifest (not a JSON object)")
        manifest = cls(data)
        if not isinstance(manifest.version, int) or manifest.version > MANIFEST_VERSION:
            raise ArtifactError(
                f"{path}: manifest_version {manifest.version!r} is newer than this hallulog "
                f"reads ({MANIFEST_VERSION}); upgrade hallulog"
            )
        return manifest

    @classmethod
    def require(cls, artifact_root: str | Path) -> RunManifest:
        """:meth:`load`, and an error naming the path when there is no manifest."""
        manifest = cls.load(artifact_root)
        if manifest is None:
            raise ArtifactError(f"{cls.path(artifact_root)}: no run manifest")
        return manifest

    def dump(self, artifact_root: str | Path) -> Path:
        """Atomic rewrite (``.partial``, fsync, ``os.replace``); the JSON as it has always been
        written (``indent=2``, keys in order)."""
        path = self.path(artifact_root)
        tmp = path.with_name(path.name + ".partial")
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(self.to_dict(), f, indent=2)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        return path

    def to_dict(self) -> dict[str, Any]:
        """A mutable copy of the whole document."""
        return dict(self.fields)

    def replace(self, **changes: Any) -> RunManifest:
        """A manifest with ``changes`` merged in (existing keys keep their place, new ones are
        appended)."""
        return RunManifest({**self.fields, **changes})

    # ------------------------------------------------------------------------ the mapping

    def __getitem__(self, key: str) -> Any:
        return self.fields[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self.fields)

    def __len__(self) -> int:
        return len(self.fields)

    def get(self, key: str, default: Any = None) -> Any:
        """The file's value, else ``default`` when given, else the :data:`DEFAULTS` value."""
        if key in self.fields:
            return self.fields[key]
        return default if default is not None else DEFAULTS.get(key)

    # ------------------------------------------------------------------------ the keys readers use

    @property
    def version(self) -> int:
        return self.get("manifest_version")

    @property
    def run_id(self) -> str | None:
        return self.get("run_id")

    @property
    def storage_format(self) -> str:
        return self.get("storage_format")

    @property
    def model_path(self) -> str | None:
        return self.get("model_path")

    @property
    def layer_ids(self) -> list[int]:
        return list(self.get("layer_ids") or [])

    @property
    def config_fingerprint(self) -> str | None:
        return self.get("config_fingerprint")

    @property
    def shard(self) -> str | None:
        return self.get("shard")

    @property
    def positions(self) -> list[str] | None:
        return self.get("positions")


def check_resumable(existing: Mapping[str, Any], fresh: Mapping[str, Any]) -> None:
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
