"""Status for the terminal: from a live run over HTTP, or from a finished run's files."""

from __future__ import annotations

import heapq
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
from hallulog.contracts import layout
from hallulog.contracts.errors import ArtifactError, HallulogError, MalformedLineError
from hallulog.contracts.jsonl import iter_lines, read_document
from hallulog.contracts.run_manifest import RunManifest

__all__ = ["fetch_status", "status_from_artifacts", "format_status", "StatusError"]


_RECENT_ERRORS = 20
"""How many of the latest errors a snapshot from files carries (all are counted)."""


class StatusError(HallulogError, RuntimeError):
    """The status could not be read (unreachable server, HTTP error, bad artifact file)."""


def fetch_status(url: str, token: str | None = None, *, timeout_s: float = 5.0) -> dict:
    """GET ``{url}/status`` (``url`` may already end in ``/status``) and return the snapshot."""
    base = url.rstrip("/")
    target = base if base.endswith("/status") else base + "/status"
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    try:
        resp = httpx.get(target, headers=headers, timeout=timeout_s)
    except httpx.HTTPError as exc:
        raise StatusError(f"cannot reach the status API at {target}: {exc}") from exc
    if resp.status_code != 200:
        try:
            message = resp.json()["error"]["message"]
        except (ValueError, KeyError, TypeError):
            message = resp.text[:200]
        hint = " (pass --token)" if resp.status_code == 401 else ""
        raise StatusError(f"{target} answered {resp.status_code}: {message}{hint}")
    return resp.json()


def status_from_artifacts(artifact_root: str | Path) -> dict:
    """A snapshot-shaped dict built from a run's files (after it ended or while it is stopped).

    Reads ``run_manifest.json``, ``completed_prompts.json`` (``{"completed": [...]}``) and per
    worker the line counts of ``prompt_index.jsonl`` / ``generations.jsonl`` and the records of
    ``errors.jsonl``. Rates, in-flight counts and server health are live-only and come back
    ``None``/empty. A torn last line (a crash mid-append) is ignored; any other malformed line
    raises :class:`StatusError` naming the file and line.
    """
    root = Path(artifact_root)
    if not root.is_dir():
        raise StatusError(f"{root}: no such artifact directory")
    checkpoint = root / layout.CHECKPOINT
    try:
        manifest = RunManifest.load(root) or RunManifest()
        completed_doc = read_document(checkpoint, "checkpoint") or {}
    except ArtifactError as exc:
        raise StatusError(str(exc)) from exc
    completed = completed_doc.get("completed", []) if isinstance(completed_doc, dict) else None
    if not isinstance(completed, list):
        raise StatusError(f"{checkpoint}: expected an object with a 'completed' list of prompt ids")
    completed_set = set(completed)

    workers = []
    recent: list[tuple[str, int, dict]] = []  # a heap of the _RECENT_ERRORS latest errors
    failed: set[str] = set()
    errors_total = 0
    generations = 0
    for wdir in sorted(root.glob("worker_*"), key=_worker_sort_key):
        if not wdir.is_dir():
            continue
        wid = _worker_id(wdir.name)
        done = _count_lines(wdir / layout.PROMPT_INDEX)
        gens = _count_lines(wdir / layout.GENERATIONS)
        generations += gens
        w_errors = 0
        for e in _iter_jsonl(wdir / layout.ERRORS):
            w_errors += 1
            pid = e.get("prompt_id")
            if pid and pid not in completed_set:
                failed.add(pid)
            e.pop("stack_trace", None)
            e.setdefault("worker_id", wid)
            # (timestamp, arrival): the order a stable sort by timestamp gives
            item = (str(e.get("timestamp", "")), errors_total, e)
            errors_total += 1
            if len(recent) < _RECENT_ERRORS:
                heapq.heappush(recent, item)
            elif item[:2] > recent[0][:2]:
                heapq.heapreplace(recent, item)
        workers.append(
            {
                "id": wid,
                "state": "stopped",
                "current_prompt": None,
                "in_flight": 0,
                "done": done,
                "errors": w_errors,
                "generations": gens,
                "tokens": None,
                "updated_at": None,
            }
        )
    errors = [e for _, _, e in sorted(recent, key=lambda item: item[:2])]

    total = _first_int(manifest, "total_prompts", "num_prompts", "prompt_count")
    done = len(completed_set) if completed_doc else sum(w["done"] for w in workers)
    if total is None:
        total = done + len(failed)
    report = layout.evaluation_dir(root) / layout.REPORT_MD
    consolidated = (layout.consolidated_dir(root) / layout.VALIDATION_REPORT).exists()
    phase = "done" if consolidated else ("stopped" if done + len(failed) < total else "running")
    config_keys = (
        "model",
        "dataset",
        "split",
        "k_samples",
        "logging_profile",
        "target_layers",
        "sequence_mode",
        "storage_format",
        "dtype",
        "max_tokens",
        "worker_count",
    )
    return {
        "version": 1,
        "source": "artifacts",
        "run_id": manifest.get("run_id"),
        "config": {k: manifest[k] for k in config_keys if k in manifest},
        "fingerprint": manifest.get("config_fingerprint", manifest.get("fingerprint")),
        "artifact_root": str(root),
        "k_samples": manifest.get("k_samples"),
        "phase": phase,
        "started_at": manifest.get("timestamp"),
        "updated_at": None,
        "now": time.time(),
        "elapsed_s": None,
        "prompts": {
            "total": total,
            "done": done,
            "failed": len(failed),
            "in_flight": 0,
            "skipped": 0,
            "remaining": max(0, total - done - len(failed)),
        },
        "progress": done / total if total else 1.0,
        "generations": generations,
        "tokens": None,
        "errors_total": errors_total,
        "rates": None,
        "eta_s": None,
        "workers": workers,
        "servers": [],
        "errors": errors,
        "history": None,
        "evaluation_report": str(report) if report.is_file() else None,
    }


def format_status(snapshot: dict) -> str:
    """Terminal text for a snapshot (live or from artifacts)."""
    s = snapshot
    p = s.get("prompts") or {}
    total, done, skipped = p.get("total", 0), p.get("done", 0), p.get("skipped", 0)
    frac = (done + skipped) / total if total else 1.0
    width = 30
    bar = "#" * round(frac * width) + "-" * (width - round(frac * width))
    lines = [
        f"run {s.get('run_id') or '?'}  phase {s.get('phase') or '?'}"
        + ("  (from artifacts)" if s.get("source") == "artifacts" else ""),
        f"artifacts {s.get('artifact_root') or '?'}  fingerprint {str(s.get('fingerprint') or '?')[:16]}",
        f"[{bar}] {done + skipped}/{total} ({100 * frac:.1f}%)",
        f"prompts: done {done}  failed {p.get('failed', 0)}  in flight {p.get('in_flight', 0)}  "
        f"skipped {skipped}  remaining {p.get('remaining', 0)}",
    ]
    rates = s.get("rates")
    if rates:
        g, t = rates.get("generations_per_s", {}), rates.get("tokens_per_s", {})
        lines.append(
            f"generations/s {g.get('recent', 0):.2f} (overall {g.get('overall', 0):.2f})  "
            f"tokens/s {t.get('recent', 0):.1f} (overall {t.get('overall', 0):.1f})  "
            f"window {rates.get('window_s', 0):.0f}s"
        )
    lines.append(
        f"generations {s.get('generations', 0)}"
        + (f"  tokens {s['tokens']}" if s.get("tokens") is not None else "")
        + f"  elapsed {_dur(s.get('elapsed_s'))}  ETA {_eta(s.get('eta_s'))}"
    )
    if s.get("evaluation_report"):
        lines.append(f"evaluation report {s['evaluation_report']}")
    workers = s.get("workers") or []
    if workers:
        lines.append("workers:")
        lines.append(
            f"  {'id':>3} {'state':<12} {'current prompt':<18} {'flight':>6} "
            f"{'done':>6} {'errors':>6}"
        )
        for w in workers:
            lines.append(
                f"  {w.get('id', '?'):>3} {str(w.get('state') or '')[:12]:<12} "
                f"{str(w.get('current_prompt') or '-'):<18} {w.get('in_flight', 0):>6} "
                f"{w.get('done', 0):>6} {w.get('errors', 0):>6}"
            )
    servers = s.get("servers") or []
    if servers:
        lines.append("servers:")
        for v in servers:
            lines.append(
                f"  {v.get('url')}  {v.get('health')}  restarts {v.get('restarts', 0)}"
                f"  in flight {v.get('in_flight', 0)}"
            )
    errors = s.get("errors") or []
    if errors:
        lines.append(f"recent errors ({s.get('errors_total', len(errors))} in all):")
        for e in errors[-5:]:
            msg = str(e.get("error_message", "")).replace("\n", " ")
            lines.append(
                f"  worker {e.get('worker_id', '?')} prompt {e.get('prompt_id', '?')} "
                f"{e.get('error_type', '?')}: {msg[:100]}"
            )
    return "\n".join(lines)


# ---- helpers --------------------------------------------------------------------------------


def _dur(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    s = int(round(seconds))
    h, rem = divmod(s, 3600)
    m, sec = divmod(rem, 60)
    return f"{h}h{m:02d}m{sec:02d}s" if h else (f"{m}m{sec:02d}s" if m else f"{sec}s")


def _eta(seconds: float | None) -> str:
    return "done" if seconds == 0 else _dur(seconds)


def _worker_id(name: str) -> int | str:
    suffix = name.partition("_")[2]
    return int(suffix) if suffix.isdigit() else suffix


def _worker_sort_key(path: Path) -> tuple[int, str]:
    wid = _worker_id(path.name)
    return (wid, "") if isinstance(wid, int) else (1 << 30, str(wid))


def _first_int(d: dict, *keys: str) -> int | None:
    for k in keys:
        if isinstance(d.get(k), int):
            return d[k]
    return None


def _count_lines(path: Path) -> int:
    """Complete (newline-terminated) lines, counted in binary chunks without parsing JSON."""
    try:
        f = path.open("rb")
    except FileNotFoundError:
        return 0
    with f:
        n = 0
        while chunk := f.read(1 << 20):
            n += chunk.count(b"\n")
        return n


def _iter_jsonl(path: Path) -> Iterator[dict]:
    """Objects of a JSONL file (:mod:`hallulog.contracts.jsonl`: a torn last line is ignored); a
    malformed line is a :class:`StatusError` naming the file and line."""
    try:
        for line in iter_lines(path):
            yield line.row
    except MalformedLineError as exc:
        raise StatusError(f"{exc.path}: line {exc.line}: {exc.what}") from exc
