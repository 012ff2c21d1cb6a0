"""A group's attention summary files, captured during generation by the embedded server
(``contracts/attention_wire.py``): moved from the server's spool into the worker's directory
(``layout.worker_attention_file``) before the group commits, where the run picks them up for
its ``attention/`` parts (``hallulog.postrun.attention_gather``). A file that cannot be moved
is left out with a warning: the run's attention pass computes that generation instead."""

from __future__ import annotations

import logging
import os
import shutil
from collections.abc import Sequence
from pathlib import Path

from hallulog.contracts import layout

__all__ = ["keep_attention", "drop_attention"]

log = logging.getLogger(__name__)


def keep_attention(worker_dir: str | Path, prompt_id: str, completions: Sequence) -> None:
    """Move completion ``i``'s file (sample ``i``) to its place in ``worker_dir``; a file
    there already (an earlier try of the prompt) is replaced."""
    for sample_id, comp in enumerate(completions):
        source = getattr(comp, "attention_path", None)
        if source is None:
            continue
        target = layout.worker_attention_file(worker_dir, prompt_id, sample_id)
        tmp = target.with_name(f".{target.name}.partial")
        try:
            target.parent.mkdir(exist_ok=True)
            try:
                os.replace(source, tmp)  # the spool is on the same file system
            except OSError:
                shutil.copyfile(source, tmp)  # e.g. --spool-root on /dev/shm
                os.unlink(source)
            os.replace(tmp, target)
        except OSError as exc:
            log.warning(
                "attention summaries of %s sample %d not kept: %s", prompt_id, sample_id, exc
            )


def drop_attention(completions: Sequence) -> None:
    """Delete the files of completions that will not be committed."""
    for comp in completions:
        source = getattr(comp, "attention_path", None)
        if source is not None:
            try:
                os.unlink(source)
            except OSError:
                pass
