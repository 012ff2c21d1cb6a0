"""``hallulog study status STUDY`` and ``study run --dry-run``: each cell's state and progress,
or each cell's estimate against the free space.

A cell's state, from its files (the way ``hallulog status ROOT`` reads a stopped run):

- ``pending``: no run has started in it (no ``run_manifest.json``);
- ``running``: a live process holds its root's lock (``contracts/root_lock.py``);
- ``done``: consolidated (``status``'s phase ``done``);
- ``failed``: started, not done, nobody holds it: the run failed or was killed (``study run``
  again resumes it).
"""

from __future__ import annotations

import json
import socket
from pathlib import Path
from typing import Any

from hallulog.cli.study_plan import StudyPlan
from hallulog.cli.study_run import cell_done
from hallulog.contracts import layout
from hallulog.contracts.process import pid_alive
from hallulog.contracts.root_lock import holder_of

__all__ = ["CELL_STATES", "cell_state", "study_status", "format_status", "dry_run"]

CELL_STATES = ("pending", "running", "done", "failed")


def _held(root: Path) -> bool:
    lease = holder_of(root)
    if not lease or not isinstance(lease.get("pid"), int):
        return False
    if lease.get("host") not in (None, socket.gethostname()):
        return True  # another host's holder: its lease decides (root_lock), taken as live
    return pid_alive(lease["pid"], lease.get("start"))


def cell_state(root: Path | str) -> str:
    """One of :data:`CELL_STATES` (see the module)."""
    root = Path(root)
    if cell_done(root):
        return "done"
    if _held(root):
        return "running"
    if not (root / layout.MANIFEST).is_file():
        return "pending"
    return "failed"


def study_status(study_root: Path | str) -> list[dict[str, Any]]:
    """One entry per cell of the study's manifest: name, state, prompts done/failed/total,
    generations, run id, fingerprint (the study's and the run's)."""
    from hallulog.api.client import status_from_artifacts
    from hallulog.study.manifest import load_study

    study = load_study(study_root)
    out = []
    for cell in study.cells:
        root = cell.path(study.root)
        entry: dict[str, Any] = {"cell": cell.name, "root": str(root), "state": cell_state(root)}
        entry["fingerprint"] = cell.fingerprint
        if entry["state"] != "pending":
            snap = status_from_artifacts(root)
            p = snap.get("prompts") or {}
            entry.update(
                done=p.get("done", 0),
                failed=p.get("failed", 0),
                total=p.get("total", 0),
                generations=snap.get("generations", 0),
                run_id=snap.get("run_id"),
                run_fingerprint=snap.get("fingerprint"),
            )
        out.append(entry)
    return out


def format_status(entries: list[dict[str, Any]], as_json: bool = False) -> str:
    if as_json:
        return json.dumps(entries, indent=2)
    width = max([len(e["cell"]) for e in entries] + [4])
    lines = [f"{'cell':<{width}}  {'state':<8} {'prompts':>13} {'failed':>6} {'generations':>11}"]
    counts = dict.fromkeys(CELL_STATES, 0)
    for e in entries:
        counts[e["state"]] += 1
        prompts = f"{e['done']}/{e['total']}" if "total" in e else "-"
        failed = str(e.get("failed", "-"))
        gens = str(e.get("generations", "-"))
        note = ""
        fp, run_fp = e.get("fingerprint"), e.get("run_fingerprint")
        if fp and run_fp and fp != run_fp:
            note = "  (its run's fingerprint differs from study.json's)"
        lines.append(
            f"{e['cell']:<{width}}  {e['state']:<8} {prompts:>13} {failed:>6} {gens:>11}{note}"
        )
    lines.append(
        ", ".join(f"{n} {s}" for s, n in counts.items() if n) + f" of {len(entries)} cells"
    )
    return "\n".join(lines)


def _duration(seconds: float) -> str:
    if seconds < 90:
        return f"~{seconds:.0f} s"
    if seconds < 5400:
        return f"~{seconds / 60:.0f} min"
    return f"~{seconds / 3600:.1f} h"


def dry_run(study: StudyPlan, *, rate: float | None = None) -> str:
    """The cells and each one's ``estimate`` (bytes; time at ``rate`` generations/s when given,
    else at the rate measured on a done cell of the same model: the cell itself first), the
    total against the free space of the study root's file system."""
    from hallulog.estimate.command import estimate
    from hallulog.estimate.measure import free_bytes
    from hallulog.estimate.projection import human_bytes

    done = {pc.name: cell_done(pc.cell.path(study.root)) for pc in study.cells}
    ests = {}
    measured: dict[str, float] = {}  # model -> generations/s of its first done cell
    for pc in sorted(study.cells, key=lambda pc: not done[pc.name]):  # done cells first
        root = pc.cell.path(study.root) if done[pc.name] else None
        given = rate or measured.get(pc.config.model)
        ests[pc.name] = est = estimate(pc.config, rate=given, from_run=root, free_space=False)
        if est.rate and root is not None:
            measured.setdefault(pc.config.model, est.rate)
    lines = [f"{len(study.cells)} cells of {study.path} under {study.root}:"]
    total_bytes, total_s, timed = 0.0, 0.0, True
    width = max(len(pc.name) for pc in study.cells)
    for pc in study.cells:
        est = ests[pc.name]
        total_bytes += est.projected_bytes
        when = "time ?"
        if est.seconds is not None:
            total_s += 0.0 if done[pc.name] else est.seconds
            when = _duration(est.seconds)
        else:
            timed = False
        lines.append(
            f"  {pc.name:<{width}}  {est.generations:>7} generations  "
            f"{human_bytes(est.projected_bytes):>10}  {when:>8}  "
            f"({'done' if done[pc.name] else 'to run'})"
        )
    free = free_bytes(study.root)
    time_text = f"{_duration(total_s)} to run" if timed else "time unknown (give --rate GEN_PER_S)"
    lines.append(
        f"total: {human_bytes(total_bytes)}, {time_text}; free on {study.root}'s file system: "
        f"{human_bytes(free)}" + ("  NOT ENOUGH SPACE" if free < total_bytes else "")
    )
    return "\n".join(lines)
