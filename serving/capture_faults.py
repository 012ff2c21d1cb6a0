"""Test-only: an embedded server that writes bad capture files, to check that the workers catch
them (docs/reliability.md, "Captures that are checked").

Not used in production. ``hallulog serve`` installs it when ``HALLULOG_CAPTURE_FAULTS`` is
set (a run's managed servers inherit the orchestrator's environment)::

    HALLULOG_CAPTURE_FAULTS="zeros@2,nan0@4,constant@6"

The n-th capture file the server writes (1-based, counted over the whole process) gets the
fault named before ``@``: ``zeros`` (every value 0), ``nan0`` (a NaN in hidden dimension 0 of
every row and layer) or ``constant`` (every row a copy of the file's first row). The file is
otherwise the real one: the right shape, dtype, token ids and ``row0``.
"""

from __future__ import annotations

import logging
import os
import threading

import torch

__all__ = ["ENV", "FAULTS", "parse_faults", "install_from_env"]

ENV = "HALLULOG_CAPTURE_FAULTS"
FAULTS = ("zeros", "nan0", "constant")

log = logging.getLogger(__name__)


def parse_faults(text: str) -> dict[int, str]:
    """``"zeros@2,nan0@4"`` → ``{2: "zeros", 4: "nan0"}``."""
    plan: dict[int, str] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        kind, _, nth = part.partition("@")
        if kind not in FAULTS or not nth.isdigit() or int(nth) < 1:
            raise ValueError(f"{ENV}: {part!r} is not FAULT@N with FAULT one of {FAULTS}")
        plan[int(nth)] = kind
    return plan


def _corrupt(hidden: torch.Tensor, kind: str) -> torch.Tensor:
    hidden = hidden.detach().clone()
    if kind == "zeros":
        hidden.zero_()
    elif kind == "nan0":
        hidden[:, :, 0] = float("nan")
    else:
        hidden[:] = hidden[:1].clone()
    return hidden


def install_from_env(spool) -> None:
    """Wrap ``spool.write`` (a :class:`hallulog.serving.capture.SpoolWriter`) with the plan
    ``$HALLULOG_CAPTURE_FAULTS`` describes (nothing when it is unset)."""
    text = os.environ.get(ENV)
    if not text:
        return
    plan = parse_faults(text)
    write = spool.write
    lock = threading.Lock()
    count = 0

    def faulty_write(hidden_states, token_ids, row0: int = 0) -> str:
        nonlocal count
        with lock:
            count += 1
            kind = plan.get(count)
        if kind is not None:
            hidden_states = _corrupt(hidden_states, kind)
            log.warning("%s: capture file %d written with fault %s", ENV, count, kind)
        return write(hidden_states, token_ids, row0)

    spool.write = faulty_write
