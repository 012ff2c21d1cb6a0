"""Reading a task file of 10⁴ / 10⁶ records in every format ``--task qa`` reads: peak memory.

For each format (jsonl, json, csv, tsv, parquet, hf: a ``datasets`` ``save_to_disk``
directory) and each size, a synthetic QA file is written to a temporary directory (fields
``qid``, ``question``, ``answer`` as a list, a ~200-character ``context``), then read in fresh
processes the way a run reads it (the task of ``RunConfig(task="qa", task_path=...,
question_field="question", answers_field="answer", id_field="qid", context_field="context")``,
opened from its ``TaskSpec``):

* ``reader``: the format's record reader only (``hallulog.tasks.records.iter_records``;
  for the baseline ``base.iter_jsonl``): no mapping, no id check, nothing kept;
* ``groups``: ``stream.groups()`` iterated, nothing kept (a) — the loader's own duplicate-id
  check is included, it keeps one entry per id for the pass;
* ``run``: what ``orchestrator run`` does (b): its plan's ids pass (``config.plan.plan_task``:
  the run keeps that set of 16-hex-digit prompt ids for the whole run), then
  ``loop._pending_groups`` over the file again.

The baseline is the built-in ``triviaqa`` loader on a JSONL file of the same records (TriviaQA's
layout, the context under an extra key), measured the same way in the same invocation.

Peak RSS is the child's ``VmHWM`` (/proc/self/status): after fork + exec, ``ru_maxrss`` keeps
the parent's high-water mark (this process writes the files), so it is printed alongside but not
used. ``base`` is the RSS after the imports (pyarrow imported by every child, so all formats
start from the same base) and before the read. Printed per format: peak RSS of each mode at each
size, the growth from the smallest to the largest size and per record, records/s of ``groups``.
The last line is one JSON object.

    python bench/bench_task_stream.py                        # 10^4 and 10^6 records
    python bench/bench_task_stream.py --sizes 10000,100000 --formats jsonl,parquet
    python bench/bench_task_stream.py --jobs 1               # one child at a time (cleaner rec/s)

With ``--jobs 2`` (default) the modes of one file run two at a time: memory figures are per
process and unaffected, records/s is what one core gives while the other is busy too.
"""

from __future__ import annotations

import argparse
import csv
import functools
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]

FORMATS = ("jsonl", "json", "csv", "tsv", "parquet", "hf")
BASELINE = "triviaqa"
MODES = ("reader", "groups", "run")
_EXT = {
    "jsonl": ".jsonl",
    "json": ".json",
    "csv": ".csv",
    "tsv": ".tsv",
    "parquet": ".parquet",
    "hf": "",
}
_BATCH = 100_000  # records per write batch


@functools.cache
def _text_pool() -> str:
    """~7 MB of pseudo-words (lowercase ASCII and spaces, fixed seed): contexts are slices of
    it, so they compress about as much as prose does (Parquet/snappy ~1.8×), not 10× as one
    repeated sentence would."""
    import random

    rng = random.Random(0)
    syllables = [
        "ka",
        "lo",
        "mi",
        "ren",
        "tas",
        "vo",
        "ul",
        "shi",
        "bar",
        "den",
        "fo",
        "gri",
        "hol",
        "ja",
        "ke",
        "lum",
        "nor",
        "pa",
        "qui",
        "ros",
        "sel",
        "tu",
        "vin",
        "wes",
        "yo",
        "zar",
        "an",
        "el",
        "or",
        "im",
    ]
    vocab = sorted({"".join(rng.choices(syllables, k=rng.randint(1, 4))) for _ in range(5000)})
    return " ".join(rng.choices(vocab, k=800_000))


def _record(i: int) -> tuple[str, str, list[str], str]:
    """(qid, question, answers, context) of record ``i``: plain ASCII, no quote or backslash;
    the context is 200 characters."""
    value = "Paris" if i % 2 else "Rome"
    head = f"[{i}] "
    pool = _text_pool()
    off = (i * 2654435761) % (len(pool) - 256)
    return (
        f"q{i:09d}",
        f"Which city is meant by riddle number {i}?",
        [value, value.upper()],
        head + pool[off : off + 200 - len(head)],
    )


def _qa_line(i: int) -> str:
    qid, question, answers, context = _record(i)
    answer = ", ".join(f'"{a}"' for a in answers)
    return (
        f'{{"qid": "{qid}", "question": "{question}", "answer": [{answer}], '
        f'"context": "{context}"}}'
    )


def _triviaqa_line(i: int) -> str:
    qid, question, answers, context = _record(i)
    aliases = ", ".join(f'"{a}"' for a in answers)
    norm = ", ".join(f'"{a.lower()}"' for a in answers)
    return (
        f'{{"QuestionId": "{qid}", "Question": "{question}", "Answer": {{"Value": '
        f'"{answers[0]}", "Aliases": [{aliases}], "NormalizedAliases": [{norm}], '
        f'"NormalizedValue": "{answers[0].lower()}"}}, "Context": "{context}"}}'
    )


def _batches(n: int, size: int = _BATCH) -> Iterator[range]:
    for start in range(0, n, size):
        yield range(start, min(n, start + size))


def write_file(fmt: str, n: int, where: Path, row_group: int = _BATCH) -> Path:
    """Write ``n`` synthetic records as ``fmt`` under ``where`` (Parquet: ``row_group`` rows a
    row group); returns the task path."""
    if fmt == BASELINE:
        path = where / "triviaqa.jsonl"
        with open(path, "w") as f:
            for batch in _batches(n):
                f.write("\n".join(map(_triviaqa_line, batch)) + "\n")
        return path
    path = where / f"qa{_EXT[fmt]}"
    if fmt == "jsonl":
        with open(path, "w") as f:
            for batch in _batches(n):
                f.write("\n".join(map(_qa_line, batch)) + "\n")
    elif fmt == "json":
        with open(path, "w") as f:
            f.write("[\n")
            for batch in _batches(n):
                if batch.start:
                    f.write(",\n")
                f.write(",\n".join(map(_qa_line, batch)))
            f.write("\n]\n")
    elif fmt in ("csv", "tsv"):
        with open(path, "w", newline="") as f:
            w = csv.writer(f, delimiter="," if fmt == "csv" else "\t")
            w.writerow(["qid", "question", "answer", "context"])
            for batch in _batches(n):  # the answer list JSON-encoded in its cell
                w.writerows((q, qu, json.dumps(a), c) for q, qu, a, c in map(_record, batch))
    elif fmt == "parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        schema = pa.schema(
            [
                ("qid", pa.string()),
                ("question", pa.string()),
                ("answer", pa.list_(pa.string())),
                ("context", pa.string()),
            ]
        )
        with pq.ParquetWriter(str(path), schema) as writer:
            for batch in _batches(n, row_group):  # one row group per batch
                cols = list(zip(*map(_record, batch)))
                writer.write_table(
                    pa.Table.from_arrays(
                        [pa.array(c, type=t) for c, t in zip(cols, schema.types)], schema=schema
                    ),
                    row_group_size=row_group,
                )
    elif fmt == "hf":
        import datasets

        datasets.disable_progress_bars()
        path = where / "qa_hf"

        def gen(count: int) -> Iterator[dict[str, Any]]:
            for i in range(count):
                qid, question, answers, context = _record(i)
                yield {"qid": qid, "question": question, "answer": answers, "context": context}

        ds = datasets.Dataset.from_generator(
            gen, gen_kwargs={"count": n}, cache_dir=str(where / "hf_cache")
        )
        ds.save_to_disk(str(path))
        del ds
        shutil.rmtree(where / "hf_cache", ignore_errors=True)
    else:
        raise ValueError(fmt)
    return path


def _size_mb(path: Path) -> float:
    if path.is_dir():
        return sum(p.stat().st_size for p in path.rglob("*") if p.is_file()) / 2**20
    return path.stat().st_size / 2**20


# ----------------------------------------------------------------------------- child side


def _status_kb(key: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"no {key} in /proc/self/status")


def task_config(fmt: str, path: str) -> dict[str, Any]:
    if fmt == BASELINE:
        return {"task": "triviaqa", "task_path": path}
    return {
        "task": "qa",
        "task_path": path,
        "question_field": "question",
        "answers_field": "answer",
        "id_field": "qid",
        "context_field": "context",
    }


def child(mode: str, fmt: str, path: str) -> None:
    """One measurement in this (fresh) process; prints one JSON line."""
    sys.path.insert(0, str(REPO))
    import pyarrow  # noqa: F401  -- every child starts from the same imports
    import pyarrow.ipc  # noqa: F401
    import pyarrow.parquet  # noqa: F401
    from hallulog.config.plan import plan_task
    from hallulog.config.run_config import RunConfig
    from hallulog.config.specs import task_spec
    from hallulog.orchestrator.run import loop
    from hallulog.tasks import open_task_spec
    from hallulog.tasks.base import MalformedCollector, iter_jsonl
    from hallulog.tasks.records import iter_records

    config = RunConfig(**task_config(fmt, path))
    stream = open_task_spec(task_spec(config))
    collector = MalformedCollector(path, strict=True)
    base_kb = _status_kb("VmRSS")
    out: dict[str, Any] = {"mode": mode, "format": fmt}
    start = time.monotonic()
    count = 0
    if mode == "reader":
        records = (
            iter_jsonl(path, collector)
            if fmt == BASELINE
            else iter_records(path, collector=collector)
        )
        for _ in records:
            count += 1
    elif mode == "groups":
        for _ in stream.groups(collector):
            count += 1
    elif mode == "run":
        task = plan_task(config)
        stream, ids = task.stream, task.prompt_ids
        out["ids_pass_s"] = round(time.monotonic() - start, 2)
        out["rss_after_ids_mb"] = round(_status_kb("VmRSS") / 1024, 1)
        for _ in loop._pending_groups(stream, ids, lambda _pid: True):
            count += 1
        out["ids"] = len(ids)
    else:
        raise SystemExit(f"unknown mode {mode}")
    wall = time.monotonic() - start
    out.update(
        records=count,
        wall_s=round(wall, 2),
        records_per_s=round(count * (2 if mode == "run" else 1) / wall),
        base_rss_mb=round(base_kb / 1024, 1),
        peak_rss_mb=round(_status_kb("VmHWM") / 1024, 1),
        ru_maxrss_mb=round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
        malformed=len(collector.items),
    )
    print(json.dumps(out))


# ----------------------------------------------------------------------------- parent side


def measure(mode: str, fmt: str, path: Path) -> dict[str, Any]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.run(
        [sys.executable, str(Path(__file__).resolve()), "--child", mode, fmt, str(path)],
        env=env,
        cwd=REPO,
        capture_output=True,
        text=True,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"{fmt} {mode} failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def bench_one(fmt: str, n: int, where: Path, jobs: int, row_group: int) -> dict[str, Any]:
    t0 = time.monotonic()
    path = write_file(fmt, n, where, row_group)
    written = time.monotonic() - t0
    size = _size_mb(path)
    with ThreadPoolExecutor(max_workers=jobs) as pool:  # longest first
        futures = {m: pool.submit(measure, m, fmt, path) for m in ("run", "groups", "reader")}
        modes = {m: futures[m].result() for m in MODES}
    for m, r in modes.items():
        if r["records"] != n:
            raise RuntimeError(f"{fmt} {m}: read {r['records']} of {n} records")
    if path.is_dir():
        shutil.rmtree(path)
    else:
        path.unlink()
    return {
        "format": fmt,
        "records": n,
        "file_mb": round(size, 1),
        "write_s": round(written, 1),
        "modes": modes,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--child", nargs=3, metavar=("MODE", "FORMAT", "PATH"), help=argparse.SUPPRESS)
    p.add_argument(
        "--sizes",
        type=lambda s: [int(x) for x in s.split(",")],
        default=[10_000, 1_000_000],
        help="record counts (comma-separated)",
    )
    p.add_argument(
        "--formats",
        type=lambda s: [x for x in s.split(",") if x],
        default=list(FORMATS),
        help=f"subset of {','.join(FORMATS)}",
    )
    p.add_argument("--jobs", type=int, default=2, help="measurements run at once")
    p.add_argument(
        "--parquet-row-group",
        type=int,
        default=_BATCH,
        help="rows per Parquet row group (default %(default)s): the Parquet reader "
        "holds one row group's column chunks at a time",
    )
    p.add_argument(
        "--dir",
        type=Path,
        default=None,
        help="write the files here (default: a temporary directory, removed at the end)",
    )
    args = p.parse_args()
    if args.child:
        child(*args.child)
        return
    unknown = set(args.formats) - set(FORMATS)
    if unknown:
        raise SystemExit(f"unknown formats: {', '.join(sorted(unknown))}")
    formats = list(args.formats)
    notes = []
    if "hf" in formats:
        try:
            import datasets  # noqa: F401
        except ImportError:
            formats.remove("hf")
            notes.append("hf skipped: the datasets package is not installed")
            print(f"note: {notes[-1]}")
    sizes = sorted(args.sizes)
    where = Path(tempfile.mkdtemp(prefix="bench_task_stream_", dir=args.dir))
    results: list[dict[str, Any]] = []
    try:
        for fmt in [BASELINE, *formats]:
            for n in sizes:
                r = bench_one(fmt, n, where, args.jobs, args.parquet_row_group)
                results.append(r)
                m = r["modes"]
                print(
                    f"{fmt:<9} {n:>9} records  file {r['file_mb']:>7.1f} MB "
                    f"(written in {r['write_s']} s)  peak RSS: reader "
                    f"{m['reader']['peak_rss_mb']:>6.1f}  groups "
                    f"{m['groups']['peak_rss_mb']:>6.1f}  run {m['run']['peak_rss_mb']:>6.1f} MB "
                    f"(base "
                    f"{m['groups']['base_rss_mb']:.0f}; run after the ids pass "
                    f"{m['run']['rss_after_ids_mb']:.0f})  groups "
                    f"{m['groups']['records_per_s']:,} rec/s",
                    flush=True,
                )
    finally:
        shutil.rmtree(where, ignore_errors=True)
    summary = _summary(results, sizes)
    _print_table(summary, sizes)
    print(
        json.dumps(
            {
                "bench": "task_stream",
                "sizes": sizes,
                "jobs": args.jobs,
                "notes": notes,
                "summary": summary,
                "results": results,
            }
        )
    )


def _summary(results: list[dict[str, Any]], sizes: list[int]) -> list[dict[str, Any]]:
    lo, hi = sizes[0], sizes[-1]
    rows = []
    for fmt in dict.fromkeys(r["format"] for r in results):
        by_n = {r["records"]: r for r in results if r["format"] == fmt}
        row: dict[str, Any] = {
            "format": fmt,
            "file_mb": {n: by_n[n]["file_mb"] for n in by_n},
            "groups_records_per_s": by_n[hi]["modes"]["groups"]["records_per_s"],
        }
        for mode in MODES:
            peaks = {n: by_n[n]["modes"][mode]["peak_rss_mb"] for n in by_n}
            growth = peaks[hi] - peaks[lo]
            row[mode] = {
                "peak_rss_mb": peaks,
                "growth_mb": round(growth, 1),
                "bytes_per_record": round(growth * 2**20 / (hi - lo)) if hi > lo else 0,
            }
        rows.append(row)
    return rows


def _print_table(summary: list[dict[str, Any]], sizes: list[int]) -> None:
    lo, hi = sizes[0], sizes[-1]
    print(
        f"\npeak RSS (MB, VmHWM of a fresh process) at {lo:,} → {hi:,} records; growth "
        f"(MB, bytes per record)"
    )
    print(
        f"{'format':<9} {'file MB':>15} | {'reader':>24} | {'groups (a)':>24} | "
        f"{'run: ids + groups (b)':>24} | groups rec/s"
    )
    for row in summary:
        cells = []
        for mode in MODES:
            d = row[mode]
            cells.append(
                f"{d['peak_rss_mb'][lo]:>5.0f} → {d['peak_rss_mb'][hi]:>5.0f} "
                f"+{d['growth_mb']:>4.0f} ({d['bytes_per_record']:>3} B)"
            )
        files = f"{row['file_mb'][lo]:.1f} → {row['file_mb'][hi]:.0f}"
        print(
            f"{row['format']:<9} {files:>15} | "
            + " | ".join(f"{c:>24}" for c in cells)
            + f" | {row['groups_records_per_s']:>10,}"
        )


if __name__ == "__main__":
    main()
