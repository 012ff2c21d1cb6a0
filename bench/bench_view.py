"""``hallulog view`` on a big run: how long the question list takes to open and to page, and the
peak memory, against reading the run's tables whole with pandas in the same run.

Writes a consolidated run of ``--prompts`` prompts (K = 5, bench/view_run.py: the Parquet
tables in consolidation's schemas, scores of 8 detectors, a report) unless ``ROOT`` holds one,
then, each in a fresh process:

- view: ``create_app(ROOT)`` (the DuckDB index built), served by uvicorn on loopback; *open* =
  from ``create_app`` to the first ``/questions`` page received over HTTP (the imports, timed
  apart, come before); then ``--pages`` requests
  of random pages (run order, a filter, a sort by a detector, a search; 50 rows each) and
  ``--pages`` question pages, each timed from request to the last byte; peak RSS of the process;
- baseline: ``pandas.read_parquet`` of prompts.parquet and generations.parquet (what a notebook
  does to look at a run): its time and peak RSS.

    python bench/bench_view.py [ROOT] [--prompts 100000] [--pages 30] [--memory-limit 512MB]

The last line is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))


def _rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _get(url: str) -> float:
    t = time.perf_counter()
    with urllib.request.urlopen(url, timeout=120) as r:
        r.read()
        assert r.status == 200, url
    return time.perf_counter() - t


def _worker_view(root: Path, pages: int, memory_limit: str) -> dict:
    t_imports = time.perf_counter()
    import duckdb  # noqa: F401
    from hallulog.view.app import create_app
    from hallulog.view.server import ViewServer

    t0, c0 = time.perf_counter(), time.process_time()
    imports_s = t0 - t_imports
    app = create_app(root, memory_limit=memory_limit)
    with ViewServer(app) as srv:
        _get(srv.url + "questions")
        open_s, open_cpu_s = time.perf_counter() - t0, time.process_time() - c0
        index = app.state.sites[""].index()
        n_pages = max(1, index.size // 50)
        method = index.default_methods[0]
        rng = random.Random(0)
        kinds = [
            "questions?page={p}",
            "questions?filter=hallucinated&page={p}",
            f"questions?sort={method}&desc=true&page={{p}}",
            "questions?filter=disagree&page={p}",
            "questions?q=riddle+number+12&page=1",
        ]
        list_s = [
            _get(srv.url + kinds[i % len(kinds)].format(p=rng.randint(1, n_pages // 3)))
            for i in range(pages)
        ]
        ids = index.page(_query(rng, n_pages))
        question_s = [_get(srv.url + f"q/{r.prompt_id}") for r in ids.rows[: max(1, pages)]]
    return {
        "imports_s": imports_s,
        "open_s": open_s,
        "open_cpu_s": open_cpu_s,
        "page_ms_median": 1000 * statistics.median(list_s),
        "page_ms_max": 1000 * max(list_s),
        "question_ms_median": 1000 * statistics.median(question_s),
        "question_ms_max": 1000 * max(question_s),
        "peak_rss_mib": _rss_mib(),
    }


def _query(rng: random.Random, n_pages: int):
    from hallulog.view.models import QuestionQuery

    return QuestionQuery(page=rng.randint(1, n_pages), per_page=50)


def _worker_baseline(root: Path) -> dict:
    t0 = time.perf_counter()
    import pandas as pd
    from hallulog.contracts import layout

    cons = layout.consolidated_dir(root)
    prompts = pd.read_parquet(cons / layout.PROMPTS_PARQUET)
    gens = pd.read_parquet(cons / layout.GENERATIONS_PARQUET)
    rows = len(prompts) + len(gens)
    return {"read_s": time.perf_counter() - t0, "rows": rows, "peak_rss_mib": _rss_mib()}


def _child(kind: str, root: Path, pages: int, memory_limit: str) -> dict:
    out = subprocess.run(
        [
            sys.executable,
            __file__,
            str(root),
            "--worker",
            kind,
            "--pages",
            str(pages),
            "--memory-limit",
            memory_limit,
        ],  # fmt: skip
        capture_output=True,
        text=True,
        check=True,
        cwd=REPO,
    ).stdout
    return json.loads(out.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("root", type=Path, nargs="?", default=None, help="run root (made if absent)")
    ap.add_argument("--prompts", type=int, default=100_000)
    ap.add_argument("--pages", type=int, default=30)
    ap.add_argument("--memory-limit", default="512MB", help="hallulog view's --memory-limit")
    ap.add_argument(
        "--no-baseline",
        action="store_true",
        help="skip the pandas read (it holds ~43 MiB a thousand prompts at K = 5)",
    )
    ap.add_argument("--worker", choices=("view", "baseline"), default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker == "view":
        print(json.dumps(_worker_view(args.root, args.pages, args.memory_limit)))
        return 0
    if args.worker == "baseline":
        print(json.dumps(_worker_baseline(args.root)))
        return 0
    from hallulog.contracts import layout

    tmp = None
    root = args.root
    if root is None:
        tmp = tempfile.TemporaryDirectory(prefix="bench-view-")
        root = Path(tmp.name) / "run"
    if not (layout.consolidated_dir(root) / layout.PROMPTS_PARQUET).is_file():
        from bench.view_run import write_view_run

        t = time.perf_counter()
        write_view_run(root, args.prompts, k=5)
        print(f"wrote a {args.prompts}-prompt run in {time.perf_counter() - t:.1f} s: {root}")
    size_mb = sum(p.stat().st_size for p in layout.consolidated_dir(root).iterdir()) / 2**20
    base = None if args.no_baseline else _child("baseline", root, args.pages, args.memory_limit)
    view = _child("view", root, args.pages, args.memory_limit)
    load = os.getloadavg()[0]
    print(
        f"run: {root} ({size_mb:.0f} MiB of Parquet), "
        f"load average {load:.1f} on {os.cpu_count()} CPUs"
    )
    if base is not None:
        print(
            f"baseline pandas read of prompts + generations: {base['read_s']:.2f} s, "
            f"peak RSS {base['peak_rss_mib']:.0f} MiB"
        )
    print(
        f"view open (index + first list page over HTTP): {view['open_s']:.2f} s, "
        f"{view['open_cpu_s']:.2f} s of CPU (after {view['imports_s']:.2f} s of imports)"
    )
    print(
        f"list page: median {view['page_ms_median']:.0f} ms, max {view['page_ms_max']:.0f} ms "
        f"({args.pages} requests); question page: median {view['question_ms_median']:.0f} ms, "
        f"max {view['question_ms_max']:.0f} ms"
    )
    print(f"view peak RSS {view['peak_rss_mib']:.0f} MiB")
    result = {
        "prompts": args.prompts,
        "memory_limit": args.memory_limit,
        "parquet_mib": round(size_mb, 1),
        "load_avg": round(load, 1),
        **{f"view_{k}": round(v, 3) for k, v in view.items()},
    }
    if base is not None:
        result.update({f"baseline_{k}": round(v, 3) for k, v in base.items()})
        result["open_vs_baseline_read"] = round(view["open_s"] / base["read_s"], 3)
        result["rss_vs_baseline"] = round(view["peak_rss_mib"] / base["peak_rss_mib"], 3)
    print(json.dumps(result))
    if tmp is not None:
        tmp.cleanup()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
