"""The attention summaries of a run (``--attention-features``): the format, its writer and its
reader (normative doc: docs/formats/attention.md).

``<root>/attention/part-NNNNNN.safetensors`` files, each a batch of generations written whole to
a hidden temporary name, fsynced and renamed: a part is there completely or not at all, so
after a SIGKILL every part on disk is committed and the pass goes on with the generations no
part holds. Each part holds

- ``features`` ``[rows, layers, heads, len(FEATURES)]`` float16: one row per generated token
  (row ``t`` is the decode step that chose token ``t``: its query is the token before it, the
  prompt's last token for ``t = 0``), the generations one after the other;
- ``rows`` ``[generations]`` int64: each generation's row count (its token count);
- metadata ``generations``: a JSON list of ``[prompt_id, sample_id, commit_id, prompt_tokens]``
  in the order of the rows, and ``layers``, ``heads``, ``features`` (comma-separated names).

```python
for g in iter_generations(root):   # streamed, one part at a time
    g.prompt_id, g.sample_id, g.features.shape   # (tokens, layers, heads, 5) float32
```
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from hallulog.contracts import layout
from hallulog.contracts.errors import ArtifactError

__all__ = [
    "FEATURES",
    "TENSORS",
    "METADATA_FIELDS",
    "AttentionGeneration",
    "write_part",
    "part_paths",
    "done_keys",
    "iter_generations",
    "has_attention",
]

FEATURES = ("context", "generated", "previous", "self", "laplacian")
"""The summaries per token, layer and head, in their order on the last axis."""
TENSORS = {"features": "F16", "rows": "I64"}
"""A part's tensors and their safetensors dtypes."""
METADATA_FIELDS = ("generations", "layers", "heads", "features")
"""A part's safetensors metadata keys."""


@dataclass
class AttentionGeneration:
    """One generation's summaries: ``features`` ``[tokens, layers, heads, 5]`` float32."""

    prompt_id: str
    sample_id: int
    commit_id: str
    prompt_tokens: int
    features: np.ndarray


def part_paths(root: str | Path) -> list[Path]:
    """The committed parts of ``root``, in order (temporary files are not listed)."""
    folder = layout.attention_dir(root)
    if not folder.is_dir():
        return []
    return sorted(p for p in folder.glob("part-*.safetensors") if not p.name.startswith("."))


def has_attention(root: str | Path) -> bool:
    return bool(part_paths(root))


def write_part(
    root: str | Path,
    generations: Sequence[tuple[str, int, str, int]],
    features: Sequence[np.ndarray],
) -> Path:
    """Commit one part: ``generations`` ``(prompt_id, sample_id, commit_id, prompt_tokens)``
    and their ``features`` (each ``[tokens, layers, heads, 5]``), at the next free index."""
    from safetensors.numpy import save_file

    if len(generations) != len(features) or not features:
        raise ValueError("one feature array per generation, at least one")
    shapes = {f.shape[1:] for f in features}
    if len(shapes) != 1 or next(iter(shapes))[-1] != len(FEATURES):
        raise ValueError(f"feature arrays must share [layers, heads, {len(FEATURES)}]: {shapes}")
    layers, heads, _ = next(iter(shapes))
    folder = layout.attention_dir(root)
    folder.mkdir(parents=True, exist_ok=True)
    existing = part_paths(root)
    index = int(existing[-1].name[5:11]) + 1 if existing else 0
    final = folder / layout.attention_part(index)
    tmp = folder / f".{final.name}.partial"
    tensors = {
        "features": np.ascontiguousarray(np.concatenate(features).astype(np.float16)),
        "rows": np.array([len(f) for f in features], dtype=np.int64),
    }
    metadata = dict(
        zip(
            METADATA_FIELDS,
            (
                json.dumps([list(g) for g in generations]),
                str(layers),
                str(heads),
                ",".join(FEATURES),
            ),
        )
    )
    save_file(tensors, str(tmp), metadata=metadata)
    os.chmod(tmp, 0o644)  # as the run's other artifacts
    with open(tmp, "rb") as f:
        os.fsync(f.fileno())
    os.replace(tmp, final)
    return final


def _metadata(path: Path) -> dict:
    from safetensors import safe_open

    try:
        with safe_open(str(path), framework="np") as f:
            return dict(f.metadata() or {})
    except Exception as exc:  # noqa: BLE001 - safetensors raises its own types
        raise ArtifactError(
            f"{path}: unreadable attention part ({exc}); delete it and rerun the attention pass"
        ) from None


def done_keys(root: str | Path) -> set[tuple[str, int, str]]:
    """``(prompt_id, sample_id, commit_id)`` of every generation the committed parts hold."""
    keys: set[tuple[str, int, str]] = set()
    for path in part_paths(root):
        for pid, sid, commit, _ in _entries(_metadata(path)):
            keys.add((pid, int(sid), commit))
    return keys


def _entries(metadata: dict) -> list:
    """A part's ``generations`` entries (its metadata is one JSON document, not JSONL)."""
    return json.loads(metadata["generations"])


def iter_generations(root: str | Path) -> Iterator[AttentionGeneration]:
    """Every stored generation, part by part (one part in memory at a time)."""
    from safetensors import safe_open

    for path in part_paths(root):
        try:
            with safe_open(str(path), framework="np") as f:
                meta = dict(f.metadata() or {})
                features = f.get_tensor("features")
                rows = f.get_tensor("rows")
        except Exception as exc:  # noqa: BLE001 - safetensors raises its own types
            raise ArtifactError(
                f"{path}: unreadable attention part ({exc}); delete it and rerun the attention pass"
            ) from None
        gens = _entries(meta)
        if len(gens) != len(rows) or int(rows.sum()) != len(features):
            raise ArtifactError(
                f"{path}: rows and generations disagree; delete it and rerun the attention pass"
            )
        at = 0
        for (pid, sid, commit, prompt_tokens), n in zip(gens, rows.tolist()):
            block = features[at : at + n].astype(np.float32)
            at += n
            yield AttentionGeneration(pid, int(sid), commit, int(prompt_tokens), block)
