"""``hallulog study run``: the cells of a planned study run, one after another or as a Slurm array.

Each cell is an ordinary ``hallulog run --config STUDY/configs/<name>.toml`` (the config file
``study run`` wrote from the cell's planned ``RunConfig``), so a cell is resumed by the run's own
resume: a re-run of ``study run`` skips the cells that are done (consolidated) and runs the
others again, which continues each where it stopped.

- ``local`` (and ``ray``, whose cells set ``executor = "ray"``: the run's Ray executor with the
  whole cluster each): each cell is a child process, ``python -m hallulog.cli.study_cell
  PARENT_PID run --config FILE``, which asks Linux to SIGKILL it when the study process dies
  (``contracts/process.py`` ``die_with_parent``; its own workers and servers go with it the same
  way), so a SIGKILLed study leaves no run behind holding the cell's root. A SIGTERM or Ctrl-C
  of the study is passed to the running cell, which stops as ``run`` stops.
- ``slurm``: ``sbatch --array`` of the cells not done, one cell per array task, with
  ``deploy/slurm/study.sbatch`` (or ``--sbatch``); the list of config files is
  ``STUDY/slurm/cells.txt`` (array task ``i`` runs line ``i + 1``).
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from hallulog.cli.study_plan import PlannedCell, StudyPlan
from hallulog.contracts import layout
from hallulog.contracts.errors import HallulogError

__all__ = [
    "EXECUTORS",
    "CellOutcome",
    "cell_done",
    "cell_command",
    "run_cells",
    "slurm_command",
    "submit_slurm",
    "default_sbatch",
]

log = logging.getLogger(__name__)

EXECUTORS = ("local", "ray", "slurm")
"""``--executor`` of ``study run``."""


@dataclass(frozen=True)
class CellOutcome:
    name: str
    state: str
    """``skipped`` (done before), ``done``, ``failed`` (its exit status), ``interrupted``."""
    returncode: int = 0


def cell_done(root: Path | str) -> bool:
    """Whether a cell's run finished: its root is consolidated (``status``'s phase ``done``)."""
    return (layout.consolidated_dir(root) / layout.VALIDATION_REPORT).is_file()


def cell_command(study: StudyPlan, pc: PlannedCell, *, python: str | None = None) -> list[str]:
    """The child process of one cell: ``run --config`` of its config file, bound to die with
    this process."""
    return [
        python or sys.executable,
        "-m",
        "hallulog.cli.study_cell",
        str(os.getpid()),
        "run",
        "--config",
        str(study.root / (pc.cell.config or "")),
    ]


def run_cells(study: StudyPlan, *, python: str | None = None) -> list[CellOutcome]:
    """Run the cells not done, in order, each as its own ``run``; a failed cell does not stop
    the next. Ctrl-C or SIGTERM stops the running cell (it is passed on) and the study."""
    outcomes: list[CellOutcome] = []
    for i, pc in enumerate(study.cells, 1):
        root = pc.cell.path(study.root)
        if cell_done(root):
            print(f"[{i}/{len(study.cells)}] {pc.name}: done before, skipped", flush=True)
            outcomes.append(CellOutcome(pc.name, "skipped"))
            continue
        print(f"[{i}/{len(study.cells)}] {pc.name}: running ({root})", flush=True)
        code = _run_child(cell_command(study, pc, python=python))
        if code in (130, -signal.SIGINT, -signal.SIGTERM):
            outcomes.append(CellOutcome(pc.name, "interrupted", code))
            print(f"{pc.name}: interrupted; rerun the same command to resume", file=sys.stderr)
            break
        state = "done" if code == 0 and cell_done(root) else "failed"
        outcomes.append(CellOutcome(pc.name, state, code))
        if state == "failed" and code == 3:  # the run ended, some prompts failed
            print(
                f"{pc.name}: some prompts failed; `hallulog retry --artifact-root {root}` "
                "reprocesses them",
                file=sys.stderr,
            )
        elif state == "failed":
            print(f"{pc.name}: failed (exit {code}); see its output above", file=sys.stderr)
    return outcomes


def _run_child(cmd: list[str]) -> int:
    child = subprocess.Popen(cmd)
    previous = signal.getsignal(signal.SIGTERM)

    def forward(signum, frame):  # noqa: ARG001
        child.send_signal(signal.SIGTERM)

    signal.signal(signal.SIGTERM, forward)
    try:
        while True:
            try:
                return child.wait()
            except KeyboardInterrupt:  # the child has its own SIGINT (same process group)
                continue
    finally:
        signal.signal(signal.SIGTERM, previous)


# ---- Slurm -------------------------------------------------------------------------------------


def default_sbatch() -> Path:
    """``deploy/slurm/study.sbatch`` of this checkout (where hallulog is installed editable)."""
    return Path(__file__).resolve().parents[1] / "deploy" / "slurm" / "study.sbatch"


def slurm_command(
    study: StudyPlan, cells: list[PlannedCell], sbatch: Path, sbatch_args: list[str]
) -> list[str]:
    """The ``sbatch`` command line of an array of ``cells`` (after writing their list)."""
    sdir = study.root.absolute() / layout.STUDY_SLURM
    return [
        shutil.which("sbatch") or "sbatch",
        "--parsable",
        f"--array=0-{len(cells) - 1}",
        f"--output={sdir}/%A_%a.out",
        f"--export=ALL,CELL_LIST={sdir / layout.STUDY_CELL_LIST},PYTHON={sys.executable}",
        *sbatch_args,
        str(sbatch),
    ]


def submit_slurm(
    study: StudyPlan, *, sbatch: Path | None = None, sbatch_args: list[str] | None = None
) -> str | None:
    """Submit the cells not done as one array; the job id (None: every cell is done)."""
    cells = [pc for pc in study.cells if not cell_done(pc.cell.path(study.root))]
    if not cells:
        return None
    script = sbatch or default_sbatch()
    if not script.is_file():
        raise HallulogError(f"{script}: no such sbatch script (give --sbatch PATH)")
    sdir = study.root / layout.STUDY_SLURM
    sdir.mkdir(parents=True, exist_ok=True)
    listing = sdir / layout.STUDY_CELL_LIST
    tmp = listing.with_name(listing.name + ".partial")
    tmp.write_text(
        "".join(f"{(study.root / (pc.cell.config or '')).absolute()}\n" for pc in cells),
        encoding="utf-8",
    )
    os.replace(tmp, listing)
    cmd = slurm_command(study, cells, script, list(sbatch_args or []))
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise HallulogError(f"sbatch: {exc}") from None
    if proc.returncode != 0:
        why = " ".join(proc.stderr.split()) or f"exit {proc.returncode}"
        raise HallulogError(f"sbatch refused the array: {why}")
    return proc.stdout.strip().split(";")[0]
