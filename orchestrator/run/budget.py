"""The run's storage budget: the free-space check before servers start, and ``--max-storage-gb``.

- :func:`preflight` projects what the pending prompts will store (``hallulog.estimate.command``:
  the expected figure when the run already holds generations to measure, exact for a fixed
  selection, else the upper bound) and refuses to start when it exceeds the free space of the
  artifact root's filesystem (``--check-free-space false`` skips it). With a cap, the
  projection is capped at what the cap still allows, and a root already at the cap stops here.
- :class:`StorageMeter` measures the artifact root's bytes (a ``du -sb`` walk without the
  spool) at most every ``STORAGE_CHECK_SECONDS`` (longer when a walk is slow: its cost stays
  under 5 % of a core) and raises :class:`StorageCapReached` once they reach the cap. That is a
  ``KeyboardInterrupt``: the run stops as on Ctrl-C or SIGTERM, committed work kept.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from pathlib import Path

from hallulog.config.plan import RunPlan
from hallulog.config.run_config import RunConfig
from hallulog.contracts.errors import HallulogError

__all__ = ["StorageCapReached", "StorageMeter", "preflight", "STORAGE_CHECK_SECONDS"]

log = logging.getLogger(__name__)
say = logging.getLogger("orchestrator.startup")

STORAGE_CHECK_SECONDS = 2.0
"""Least time between two measurements of the artifact root under ``--max-storage-gb``."""
_WALK_COST_FACTOR = 20
"""A walk that takes t seconds is repeated after at least ``20 t``."""


class StorageCapReached(KeyboardInterrupt):
    """The artifact root holds ``--max-storage-gb``: stop like an interrupt (work kept)."""

    def __init__(self, stored: int, cap_gb: float) -> None:
        self.stored, self.cap_gb = stored, cap_gb
        super().__init__(
            f"storage cap reached: {stored / 1e9:.3g} GB >= --max-storage-gb "
            f"{cap_gb:g}; committed work is kept; raise the cap and rerun to "
            "resume"
        )


def _spools(root: Path, config: RunConfig) -> list[Path]:
    spools = [root / "spool"]
    if config.spool_root is not None:
        spools.append(Path(config.spool_root))
    return spools


class StorageMeter:
    """The artifact root's stored bytes against ``cap_gb`` (GB = 10^9 bytes)."""

    def __init__(
        self,
        root: Path,
        cap_gb: float,
        *,
        skip: Iterable[Path] = (),
        min_interval: float | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.root, self.cap_gb = Path(root), float(cap_gb)
        self.cap_bytes = int(self.cap_gb * 1e9)
        self.skip = tuple(skip)
        self.min_interval = STORAGE_CHECK_SECONDS if min_interval is None else min_interval
        self.clock = clock
        self.stored = 0
        self._due = 0.0

    def measure(self) -> int:
        from hallulog.estimate.measure import tree_bytes

        started = self.clock()
        self.stored = tree_bytes(self.root, skip=self.skip)
        took = self.clock() - started
        self._due = self.clock() + max(self.min_interval, _WALK_COST_FACTOR * took)
        return self.stored

    def poll(self) -> None:
        """Measure when due; raise :class:`StorageCapReached` at or over the cap."""
        if self.clock() < self._due:
            return
        if self.measure() >= self.cap_bytes:
            raise StorageCapReached(self.stored, self.cap_gb)


def preflight(config: RunConfig, plan: RunPlan, root: Path, *, pending: int) -> StorageMeter | None:
    """Check the budget of the ``pending`` prompts before servers start; the meter of
    ``--max-storage-gb`` (None without a cap)."""
    meter = None
    room: float | None = None
    if config.max_storage_gb is not None:
        meter = StorageMeter(root, config.max_storage_gb, skip=_spools(root, config))
        stored = meter.measure()
        if stored >= meter.cap_bytes:
            raise StorageCapReached(stored, config.max_storage_gb)
        room = meter.cap_bytes - stored
    if config.check_free_space:
        _check_free_space(config, plan, root, pending=pending, room=room)
    return meter


def _check_free_space(
    config: RunConfig, plan: RunPlan, root: Path, *, pending: int, room: float | None
) -> None:
    from hallulog.estimate.measure import (
        Lengths,
        free_bytes,
        measure_run,
        pilot_lengths,
        task_prompts,
    )
    from hallulog.estimate.projection import Selection, human_bytes, project

    selection = Selection.of(plan.stored)
    measured = measure_run(root, with_metadata=False)
    lengths = pilot_lengths(measured) if measured is not None else Lengths()
    if selection.needs_prompt_length and measured is None:
        _, lengths = task_prompts(
            plan.task.stream,
            chat=config.chat,
            tokenizer_dir=plan.model.path,
            lengths=True,
            template_kwargs=dict(plan.chat_template_kwargs),
        )
    est = project(
        selection,
        hidden_size=plan.model.hidden_size,
        storage_format=plan.storage_format,
        max_tokens=config.max_tokens,
        k_samples=config.k_samples,
        prompts=pending,
        lengths=lengths,
        num_hidden_layers=plan.model.num_hidden_layers,
    )
    if plan.stored.attention_features:  # docs/formats/attention.md
        from hallulog.estimate.attention import attention_bytes, model_heads

        heads = model_heads(plan.model.path) or 0
        est.attention_bytes = attention_bytes(
            config.max_tokens, plan.model.num_hidden_layers, heads
        )
    needed = est.projected_bytes if room is None else min(est.projected_bytes, room)
    free = free_bytes(root)
    what = {
        "exact": "exact",
        "pilot": f"expected from the {len(lengths.samples)} generations stored so far",
        "upper_bound": f"upper bound: every answer at --max-tokens {config.max_tokens}",
    }[est.basis]
    capped = " (--max-storage-gb)" if room is not None and needed < est.projected_bytes else ""
    if needed > free:
        raise HallulogError(
            f"not enough free space: the {pending} pending prompt(s) project "
            f"{human_bytes(needed)}{capped} ({what}) and the filesystem of {root} has "
            f"{human_bytes(free)} free; free some, narrow the selection, set "
            "--max-storage-gb, or pass --check-free-space false to start anyway "
            "(python -m orchestrator estimate shows the projection)"
        )
    say.info(
        "storage: the %d pending prompt(s) project %s%s (%s); %s free",
        pending,
        human_bytes(needed),
        capped,
        what,
        human_bytes(free),
    )
