"""The post-run pipeline, written once: consolidate → exports → validate.

A finished run (``hallulog.orchestrator.run.loop``), a merge of shard roots (``postrun/merge.py``) and the
``consolidate`` command (``cli/commands.py``) all call :func:`finish`; labelling by the
LLM judge comes before it (it needs a server), the printing after it (the callers say what they
did in their own words).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["finish", "Finished"]


@dataclass
class Finished:
    """What :func:`finish` did: the consolidation summary, the export row counts by file, and
    the validation report (``report["ok"]`` says whether the artifacts are complete)."""

    consolidation: Any
    exports: dict[str, int]
    validation: dict[str, Any]

    @property
    def ok(self) -> bool:
        return bool(self.validation["ok"])


def finish(
    root: Path,
    *,
    expected_prompt_ids: set[str] | None = None,
    merge: bool = False,
    on_step: Callable[[str], None] | None = None,
) -> Finished:
    """Consolidate ``root``'s worker outputs, write the exports, validate the result.

    ``expected_prompt_ids``: the prompts the run must hold (validation reports the missing
    ones); ``merge``: physically merge shard-format worker stores instead of writing a manifest
    over them; ``on_step(name)`` is called as ``consolidating`` and ``exporting`` begin (the run
    shows them as its phase).
    """
    from hallulog.exports.methods import write_exports
    from hallulog.postrun.consolidate import consolidate
    from hallulog.postrun.validate import validate

    step = on_step or (lambda name: None)
    root = Path(root)
    step("consolidating")
    consolidation = consolidate(root, merge=merge)
    step("exporting")
    exports = write_exports(root)
    validation = validate(root, expected_prompt_ids=expected_prompt_ids)
    return Finished(consolidation=consolidation, exports=exports, validation=validation)
