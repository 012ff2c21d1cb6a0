"""A run of 10⁴ / 10⁵ (/ 10⁶) generations against instant backends: what hallulog itself costs.

The real orchestrator (``python -m orchestrator run --manage-servers false --server-urls ...``)
runs a synthetic TriviaQA file against ``--servers`` instances of ``bench/instant_backend.py``
(canned 12-token answers, random hidden states; no model), light profile, K=5, with a tiny fake
model directory (``config.json`` only: layers and hidden size). The backends write their capture
files to ``--spool-root`` (default /dev/shm, a tmpfs; ``run``: the run's directory on the disk):
on this machine's journal-less ext4 the kernel's inode allocator makes each file create dearer as
a long run goes on, which is the backends' cost but takes the two cores from the workers. Then
every post-run phase runs in its own process: label counts, consolidate (+ Parquet), exports,
validate, status from files, the ``--retry-failed`` scan.

Printed per size: generations/s of the run; CPU ms per generation of orchestrator + workers
(utime + stime of the process tree, backends excluded) for the run and for the post-run the run
does itself (label counts, consolidate, exports, validate), and apart from those the phases other
commands run on demand (status from files, the ``--retry-failed`` scan); peak
RSS of the run's process tree (sampled every 0.2 s from /proc via psutil) and of each post-run
phase (its ru_maxrss); each server's share of the requests; the wall time of each post-run
phase. The last line is one JSON object.

    python bench/bench_scale.py                 # 10^4 and 10^5 generations
    python bench/bench_scale.py --sizes 12000   # one size
    python bench/bench_scale.py --million       # adds 10^6
    python bench/bench_scale.py --sizes 100000 --kill-at 0.5
        # SIGKILL the orchestrator half way, resume it: prints how many committed prompts the
        # resumed session redid (0 is right) and validates the result
    python bench/bench_scale.py --sizes 100000 --task-format parquet
        # the prompts as a Parquet file run by --task qa (jsonl, csv too; default: triviaqa)
    python bench/bench_scale.py --synthetic --sizes 100000 --baseline ../older-checkout
        # post-run phases only, on a directory written by the real writer (hallulog.workers.persist),
        # with this checkout and with the baseline's code on a copy: ratios per phase
    python bench/bench_scale.py --sizes 1200 --model-shape 8b --profile integrated --postrun false
        # the bytes path at a real model's shape (8b: 33 layer ids x 4096, float16; 70b: 81 x
        # 8192): stored bytes/s end to end against the sequential write rate of the same disk
        # measured in the same run (before and after the run), bytes written to the disk per
        # byte stored (the run's rusage write_bytes, and /proc/diskstats), CPU seconds per GB

The backends run with ``--vary-rows``: each capture starts at a pool row that depends on its
tokens, so the stored activations differ between prompts and ``python -m orchestrator evaluate``
on a kept run (``--keep``) fits its probes on non-degenerate features.

Bytes figures (every run): ``stored_bytes`` (the files of every worker's store), the run's
rate (stored bytes / wall) and its steady rate (between 10 % and 90 % of the final bytes,
sampled every 0.2 s), ``sequential_write_MBps`` (16 MiB writes + fdatasync of min(stored bytes,
2 GiB) in the artifact root, before and after the run: their mean), ``disk_bytes_per_stored_byte``
(``ru_oublock`` of the orchestrator and its reaped workers: bytes they sent to a block device,
i.e. not the tmpfs spool) and ``diskstats_bytes_per_stored_byte`` (sectors written to the artifact
root's device while the run ran: every process's, so other jobs on the disk count too),
``cpu_s_per_GB`` (orchestrator + workers; the backends' own apart).

On a small shared machine the figures are noisy: the backends share the cores with what is
measured, so compare sizes within one invocation.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parents[1]
# --phase runs import the post-run code from BENCH_CODE (a baseline checkout) when it is set
CODE = Path(os.environ.get("BENCH_CODE") or REPO)
sys.path.insert(0, str(CODE))

sys.path.insert(1, str(Path(__file__).resolve().parent))
from instant_backend import parse_model_shape  # noqa: E402
from instant_run import (  # noqa: E402  (the synthetic task and model; light profile: ids 3, 4)
    HIDDEN,
    NUM_LAYERS,
    write_model,
    write_task,
)

#: what ``orchestrator run`` itself does once the queue drains (orchestrator/run/loop.py)
RUN_PHASES = ("label_counts", "consolidate", "exports", "validate")
#: what other commands do on demand: the status page from files, the --retry-failed scan
ON_DEMAND_PHASES = ("status", "retry_scan")
PHASES = RUN_PHASES + ON_DEMAND_PHASES


def _phase(name: str, root: Path) -> None:
    """Run one post-run phase in this process (the child side of :func:`run_phase`)."""
    from hallulog.api.client import status_from_artifacts
    from hallulog.exports.methods import write_exports
    from hallulog.postrun.consolidate import consolidate
    from hallulog.postrun.labels import label_counts
    from hallulog.postrun.repair import prompts_to_retry
    from hallulog.postrun.validate import validate

    ru0 = resource.getrusage(resource.RUSAGE_SELF)  # imports are not the phase's cost
    base_rss = psutil.Process().memory_info().rss
    start = time.monotonic()
    out: object
    if name == "label_counts":
        out = label_counts(root)
    elif name == "consolidate":
        out = {k: v for k, v in consolidate(root).items() if k != "timestamp"}
    elif name == "exports":
        out = write_exports(root)
    elif name == "validate":
        report = validate(root)
        out = {"ok": report["ok"], "counts": report["counts"], "problems": report["problem_counts"]}
    elif name == "status":
        s = status_from_artifacts(root)
        out = {"done": s["prompts"]["done"], "generations": s["generations"]}
    elif name == "retry_scan":
        out = {"retry": len(prompts_to_retry(root, set()))}
    else:
        raise SystemExit(f"unknown phase {name}")
    wall = time.monotonic() - start
    ru = resource.getrusage(resource.RUSAGE_SELF)
    # VmHWM, not ru_maxrss: after fork + exec, ru_maxrss keeps the parent's high-water mark
    print(
        json.dumps(
            {
                "phase": name,
                "wall_s": round(wall, 3),
                "cpu_s": round(ru.ru_utime + ru.ru_stime - ru0.ru_utime - ru0.ru_stime, 3),
                "peak_rss_mb": round(_vm_hwm_kb() / 1024, 1),
                "base_rss_mb": round(base_rss / 2**20, 1),
                "result": out,
            }
        )
    )


def _vm_hwm_kb() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


def run_phase(name: str, root: Path, env: dict[str, str], code: Path = REPO) -> dict:
    env = {**env, "PYTHONPATH": str(code), "BENCH_CODE": str(code)}
    proc = subprocess.run(
        [sys.executable, str(Path(__file__).resolve()), "--phase", name, str(root)],
        env=env,
        capture_output=True,
        text=True,
        cwd=code,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"phase {name} failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


#: ``--task-format``: the file the synthetic prompts are written as (``triviaqa``: the built-in
#: loader's JSONL; the others: a plain QA file read by ``--task qa`` through a field mapping)
TASK_FORMATS = ("triviaqa", "jsonl", "csv", "parquet")
QA_FIELD_FLAGS = ["--question-field", "question", "--answers-field", "answer", "--id-field", "qid"]


def write_qa_task(path: Path, prompts: int, fmt: str) -> None:
    """The same prompts as :func:`write_task` as a ``--task qa`` file (qid, question, answer
    list; a CSV cell holds the list JSON-encoded)."""

    def rows(start: int, stop: int):
        for i in range(start, stop):
            value = "Paris" if i % 2 else "Rome"
            yield (f"bench_{i:07d}", f"Which city is meant by riddle number {i}?", [value])

    if fmt == "jsonl":
        with open(path, "w") as f:
            for qid, question, answer in rows(0, prompts):
                f.write(json.dumps({"qid": qid, "question": question, "answer": answer}) + "\n")
    elif fmt == "csv":
        import csv

        with open(path, "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(["qid", "question", "answer"])
            w.writerows((q, qu, json.dumps(a)) for q, qu, a in rows(0, prompts))
    elif fmt == "parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        schema = pa.schema(
            [("qid", pa.string()), ("question", pa.string()), ("answer", pa.list_(pa.string()))]
        )
        with pq.ParquetWriter(str(path), schema) as writer:
            for start in range(0, prompts, 100_000):
                cols = list(zip(*rows(start, min(prompts, start + 100_000))))
                writer.write_table(
                    pa.Table.from_arrays(
                        [pa.array(c, type=t) for c, t in zip(cols, schema.types)], schema=schema
                    )
                )
    else:
        raise ValueError(f"unknown task format {fmt!r}")


def profile_layer_ids(profile: str, num_layers: int) -> list[int]:
    """The layer ids a run of ``profile`` asks the server for (config/profiles.py)."""
    from hallulog.config.profiles import PROFILES, select_layer_ids

    return select_layer_ids(PROFILES[profile].target_layers, num_layers)


def stored_bytes(root: Path) -> int:
    """Bytes of every file of every worker's activation store."""
    total = 0
    for store in root.glob("worker_*/activations"):
        for dirpath, _, files in os.walk(store):
            for name in files:
                try:
                    total += os.stat(os.path.join(dirpath, name)).st_size
                except FileNotFoundError:
                    pass
    return total


def sequential_write_rate(directory: Path, nbytes: int, block: int = 16 << 20) -> float:
    """Bytes/s of ``nbytes`` written in ``block`` writes to a new file, then fdatasync'ed."""
    buf = memoryview(os.urandom(block))
    path = directory / f".bench_seq_{os.getpid()}"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        t0 = time.perf_counter()
        done = 0
        while done < nbytes:
            done += os.write(fd, buf[: min(block, nbytes - done)])
        os.fdatasync(fd)
        return nbytes / (time.perf_counter() - t0)
    finally:
        os.close(fd)
        os.unlink(path)


def _device_of(path: Path) -> str | None:
    """The /proc/diskstats name of the block device holding ``path`` (None: not a disk)."""
    st = os.stat(path)
    major, minor = os.major(st.st_dev), os.minor(st.st_dev)
    with open("/proc/diskstats") as f:
        for line in f:
            parts = line.split()
            if int(parts[0]) == major and int(parts[1]) == minor:
                return parts[2]
    return None


def _sectors_written(device: str | None) -> int:
    if device is None:
        return 0
    with open("/proc/diskstats") as f:
        for line in f:
            parts = line.split()
            if parts[2] == device:
                return int(parts[9])
    return 0


def _steady_rate(series: list[tuple[float, int]]) -> float | None:
    """Bytes/s between 10 % and 90 % of the final bytes of a (time, bytes) series."""
    if len(series) < 3 or series[-1][1] <= 0:
        return None
    final = series[-1][1]

    def at(share: float) -> tuple[float, int]:
        return next(p for p in series if p[1] >= share * final)

    (t0, b0), (t1, b1) = at(0.1), at(0.9)
    return (b1 - b0) / (t1 - t0) if t1 > t0 else None


class TreeSampler(threading.Thread):
    """Peak RSS (sum over the process and its descendants) and last seen CPU times."""

    def __init__(self, pid: int, interval: float = 0.2, probe=None) -> None:
        super().__init__(daemon=True)
        self.pid, self.interval = pid, interval
        self.probe = probe
        """Called at every sample (e.g. the stored bytes so far): ``series`` keeps (time, value)."""
        self.series: list[tuple[float, int]] = []
        self.peak_rss = 0
        self.cpu_s: dict[int, float] = {}
        """Last seen CPU seconds per process of the tree: what a SIGKILLed session used (its
        orphaned workers are never reaped by the orchestrator, so rusage misses them)."""
        self.stop = threading.Event()

    def run(self) -> None:
        try:
            top = psutil.Process(self.pid)
        except psutil.NoSuchProcess:
            return
        while not self.stop.is_set():
            try:
                procs = [top, *top.children(recursive=True)]
            except psutil.NoSuchProcess:
                return
            rss = 0
            for p in procs:
                try:
                    rss += p.memory_info().rss
                    cpu = p.cpu_times()
                    self.cpu_s[p.pid] = cpu.user + cpu.system
                except psutil.NoSuchProcess:
                    pass
            self.peak_rss = max(self.peak_rss, rss)
            if self.probe is not None:
                self.series.append((time.monotonic(), self.probe()))
            self.stop.wait(self.interval)


def _requests_served(url: str) -> float:
    with urllib.request.urlopen(f"{url}/metrics", timeout=10) as resp:
        for line in resp.read().decode().splitlines():
            if line.startswith("hallulog_instant_requests_total"):
                return float(line.rsplit(" ", 1)[1])
    return 0.0


def _committed_prompts(root: Path) -> int:
    """Prompts committed so far: lines of the workers' ``prompt_index.jsonl`` files."""
    total = 0
    for path in root.glob("worker_*/prompt_index.jsonl"):
        with open(path, "rb") as f:
            total += sum(chunk.count(b"\n") for chunk in iter(lambda: f.read(1 << 20), b""))
    return total


def _session(
    cmd: list[str],
    env: dict[str, str],
    *,
    kill_when: int | None = None,
    root: Path | None = None,
    probe=None,
    series: list | None = None,
) -> tuple[int, int, str, float]:
    """One orchestrator session: (committed prompts when killed, peak tree RSS, output, CPU
    seconds of the tree as sampled).

    With ``kill_when``, the orchestrator is SIGKILLed (its workers die with it: PDEATHSIG) as
    soon as that many prompts are committed; otherwise it must finish cleanly.
    """
    proc = subprocess.Popen(
        cmd, env=env, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    sampler = TreeSampler(proc.pid, probe=probe)
    sampler.start()
    killed_at = 0
    if kill_when is not None:
        assert root is not None
        while proc.poll() is None:
            killed_at = _committed_prompts(root)
            if killed_at >= kill_when:
                proc.send_signal(signal.SIGKILL)
                break
            time.sleep(0.5)
        if proc.wait() != -signal.SIGKILL:
            raise RuntimeError(f"the run ended ({proc.returncode}) before the SIGKILL")
        output = proc.stdout.read() if proc.stdout else ""
    else:
        output, _ = proc.communicate()
        if proc.returncode != 0:
            raise RuntimeError(f"run failed ({proc.returncode}):\n{output[-4000:]}")
    sampler.stop.set()
    sampler.join()
    if series is not None:
        series.extend(sampler.series)
    return killed_at, sampler.peak_rss, output, sum(sampler.cpu_s.values())


def bench_size(
    generations: int,
    *,
    k: int,
    servers: int,
    workers: int,
    groups_in_flight: int,
    base_port: int,
    storage_format: str,
    keep: bool,
    kill_at: float | None = None,
    spool_root: str | None = None,
    task_format: str = "triviaqa",
    model_shape: tuple[int, int] = (NUM_LAYERS, HIDDEN),
    profile: str = "light",
    answer_tokens: int = 12,
    postrun: bool = True,
) -> dict:
    prompts = -(-generations // (k + 1))
    num_layers, hidden = model_shape
    layer_ids = profile_layer_ids(profile, num_layers)
    tmp = Path(tempfile.mkdtemp(prefix=f"bench_scale_{generations}_"))
    spool = (
        Path(tempfile.mkdtemp(prefix="bench_scale_spool_", dir=spool_root))
        if spool_root
        else tmp / "spool"
    )
    root, model = tmp / "run", tmp / "fake-model"
    write_model(model, num_layers, hidden)
    if task_format == "triviaqa":
        task = tmp / "questions.jsonl"
        write_task(task, prompts)
        task_flags = ["--task", "triviaqa", "--task-path", str(task)]
    else:
        task = tmp / f"questions.{task_format}"
        write_qa_task(task, prompts, task_format)
        task_flags = ["--task", "qa", "--task-path", str(task), *QA_FIELD_FLAGS]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    backends, urls = [], []
    try:
        for i in range(servers):
            port = base_port + i
            backends.append(
                subprocess.Popen(
                    [
                        sys.executable,
                        str(REPO / "bench" / "instant_backend.py"),
                        "--port",
                        str(port),
                        "--spool-dir",
                        str(spool / f"s{i}"),
                        "--num-layer-ids",
                        str(len(layer_ids)),
                        "--hidden-size",
                        str(hidden),
                        "--served-model-name",
                        model.name,
                        "--answer-tokens",
                        str(answer_tokens),
                        "--vary-rows",
                    ],
                    env=env,
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                )
            )
            urls.append(f"http://127.0.0.1:{port}")
        for url in urls:
            _wait_health(url)
        cmd = [
            sys.executable,
            "-m",
            "orchestrator",
            "run",
            "--artifact-root",
            str(root),
            *task_flags,
            "--model",
            str(model),
            "--manage-servers",
            "false",
            "--server-urls",
            ",".join(urls),
            "--logging-profile",
            profile,
            "--k-samples",
            str(k),
            "--max-tokens",
            str(answer_tokens),
            "--storage-format",
            storage_format,
            "--num-workers",
            str(workers),
            "--groups-in-flight",
            str(groups_in_flight),
            "--consolidate",
            "false",
            "--progress",
            "false",
            "--checkpoint-every",
            "100",
            "--log-level",
            "WARNING",
        ]
        # the disk's sequential write rate, in the artifact root's file system, before the run
        # (and after it: the disk's state moves from one minute to the next)
        root.mkdir(parents=True, exist_ok=True)
        per_gen = _bytes_per_generation(profile, len(layer_ids), hidden, answer_tokens)
        seq_bytes = int(min(2 << 30, max(256 << 20, per_gen * generations)))
        seq_rates = [sequential_write_rate(root, seq_bytes)]
        device = _device_of(root)
        sectors0 = _sectors_written(device)
        series: list[tuple[float, int]] = []
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        started = time.monotonic()
        peak_rss, resume, killed_cpu = 0, None, 0.0
        if kill_at is not None:  # first session: SIGKILLed once that share is committed
            killed_at, rss, _, killed_cpu = _session(
                cmd, env, kill_when=int(kill_at * prompts), root=root
            )
            peak_rss = rss
            resume = {"killed_with_committed_prompts": killed_at}
            before = resource.getrusage(resource.RUSAGE_CHILDREN)
        committed_before = _committed_prompts(root)
        _, rss, output, _ = _session(cmd, env, probe=lambda: stored_bytes(root), series=series)
        peak_rss = max(peak_rss, rss)
        wall = time.monotonic() - started
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        sectors1 = _sectors_written(device)
        seq_rates.append(sequential_write_rate(root, seq_bytes))
        stored = stored_bytes(root)
        backend_cpu = 0.0
        for b in backends:
            try:
                t = psutil.Process(b.pid).cpu_times()
                backend_cpu += t.user + t.system
            except psutil.NoSuchProcess:
                pass
        if resume is not None:
            m = re.search(r"(\d+)/(\d+) prompts done \((\d+) this session, (\d+) before\)", output)
            if not m:
                raise RuntimeError(f"resumed run printed no summary:\n{output[-2000:]}")
            this_session, before_count = int(m.group(3)), int(m.group(4))
            resume.update(
                committed_on_disk_at_resume=committed_before,
                resumed_this_session=this_session,
                resumed_before=before_count,
                redone_prompts=this_session + before_count - prompts,
            )
        run_cpu = (
            (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime) + killed_cpu
        )
        served = [_requests_served(u) for u in urls]
        total_req = sum(served) or 1.0
        phases = {name: run_phase(name, root, env) for name in PHASES} if postrun else {}
        post_cpu = sum(phases[n]["cpu_s"] for n in RUN_PHASES) if postrun else 0.0
        on_demand_cpu = sum(phases[n]["cpu_s"] for n in ON_DEMAND_PHASES) if postrun else 0.0
        made = prompts * (k + 1)
        seq = sum(seq_rates) / len(seq_rates)
        steady = _steady_rate(series)
        disk_written = (after.ru_oublock - before.ru_oublock) * 512
        gb = max(stored, 1) / 1e9
        bytes_path = {
            "model_shape": f"{num_layers}:{hidden}",
            "profile": profile,
            "layer_ids": len(layer_ids),
            "answer_tokens": answer_tokens,
            "stored_bytes": stored,
            "stored_MB_per_generation": round(stored / made / 1e6, 3),
            "stored_MBps": round(stored / wall / 1e6, 1),
            "stored_steady_MBps": round(steady / 1e6, 1) if steady else None,
            "sequential_write_MBps": round(seq / 1e6, 1),
            "sequential_write_runs_MBps": [round(r / 1e6, 1) for r in seq_rates],
            "ratio_vs_sequential": round(stored / wall / seq, 3),
            "ratio_steady_vs_sequential": round(steady / seq, 3) if steady else None,
            "disk_bytes_per_stored_byte": round(disk_written / max(stored, 1), 3),
            "diskstats_device": device,
            "diskstats_bytes_per_stored_byte": round(
                (sectors1 - sectors0) * 512 / max(stored, 1), 3
            )
            if device
            else None,
            "cpu_s_per_GB": round(run_cpu / gb, 2),
            "backend_cpu_s_per_GB": round(backend_cpu / gb, 2),
        }
        return {
            "generations": made,
            "prompts": prompts,
            "k_samples": k,
            "servers": servers,
            "workers": workers,
            "storage_format": storage_format,
            "task_format": task_format,
            "spool": {"dir": str(spool), "filesystem": _filesystem(spool)},
            "run_wall_s": round(wall, 2),
            "generations_per_s": round(made / wall, 1),
            "run_cpu_ms_per_generation": round(1000 * run_cpu / made, 3),
            "postrun_cpu_ms_per_generation": round(1000 * post_cpu / made, 3),
            "cpu_ms_per_generation": round(1000 * (run_cpu + post_cpu) / made, 3),
            "on_demand_cpu_ms_per_generation": round(1000 * on_demand_cpu / made, 3),
            "cpu_ms_per_generation_all_phases": round(
                1000 * (run_cpu + post_cpu + on_demand_cpu) / made, 3
            ),
            "run_peak_rss_mb": round(peak_rss / 2**20, 1),
            "postrun_peak_rss_mb": max((p["peak_rss_mb"] for p in phases.values()), default=0),
            "server_request_share": [round(s / total_req, 3) for s in served],
            "bytes_path": bytes_path,
            "phases": {
                n: {
                    "wall_s": p["wall_s"],
                    "cpu_s": p["cpu_s"],
                    "peak_rss_mb": p["peak_rss_mb"],
                    "base_rss_mb": p["base_rss_mb"],
                }
                for n, p in phases.items()
            },
            "validation": phases["validate"]["result"] if postrun else None,
            "artifact_root": str(root),
            **({"sigkill_resume": resume} if resume is not None else {}),
        }
    finally:
        for b in backends:
            b.terminate()
        for b in backends:
            try:
                b.wait(timeout=10)
            except subprocess.TimeoutExpired:
                b.kill()
        if spool_root:
            shutil.rmtree(spool, ignore_errors=True)
        if not keep:
            shutil.rmtree(tmp, ignore_errors=True)
        else:
            print(f"kept {tmp}", file=sys.stderr)


def _bytes_per_generation(profile: str, num_layer_ids: int, hidden: int, answer_tokens: int) -> int:
    """About what a generation stores (float16): sizes the sequential-write baseline."""
    from hallulog.config.profiles import PROFILES

    rows = {"all": 48 + answer_tokens, "prompt": 48, "response": answer_tokens + 1, "last": 1}.get(
        PROFILES[profile].sequence_mode, 4
    )
    return num_layer_ids * rows * hidden * 2


def _filesystem(path: Path) -> str:
    """The type of the filesystem ``path`` is on (the mount point with the longest prefix)."""
    best = ("", "?")
    for part in psutil.disk_partitions(all=True):
        mount = part.mountpoint.rstrip("/") + "/"
        if (str(path.resolve()) + "/").startswith(mount) and len(mount) > len(best[0]):
            best = (mount, part.fstype)
    return best[1]


def bench_synthetic(
    generations: int,
    *,
    k: int,
    workers: int,
    storage_format: str,
    baseline: Path | None,
    keep: bool,
) -> dict:
    """Post-run phases only, on a run directory written by the real writer (no orchestrator)."""
    sys.path.insert(0, str(REPO))
    from tests.postrun.postrun_fixtures import build_run

    prompts = -(-generations // (k + 1))
    tmp = Path(tempfile.mkdtemp(prefix=f"bench_scale_synth_{generations}_"))
    root = tmp / "run"
    try:
        t0 = time.monotonic()
        build_run(root, prompts=prompts, k=k, workers=workers, fmt=storage_format, durable=False)
        built = time.monotonic() - t0
        env = dict(os.environ)
        result: dict = {
            "generations": prompts * (k + 1),
            "prompts": prompts,
            "k_samples": k,
            "workers": workers,
            "storage_format": storage_format,
            "build_s": round(built, 1),
        }
        runs = [("current", REPO, root)]
        if baseline is not None:
            subprocess.run(["cp", "-a", str(root), str(tmp / "run_baseline")], check=True)
            runs.insert(0, ("baseline", baseline, tmp / "run_baseline"))
        for label, code, where in runs:
            phases = {name: run_phase(name, where, env, code) for name in PHASES}
            cpu = sum(phases[n]["cpu_s"] for n in RUN_PHASES)
            on_demand = sum(phases[n]["cpu_s"] for n in ON_DEMAND_PHASES)
            result[label] = {
                "postrun_cpu_ms_per_generation": round(1000 * cpu / result["generations"], 3),
                "on_demand_cpu_ms_per_generation": round(
                    1000 * on_demand / result["generations"], 3
                ),
                "postrun_peak_rss_mb": max(p["peak_rss_mb"] for p in phases.values()),
                "phases": {
                    n: {k2: p[k2] for k2 in ("wall_s", "cpu_s", "peak_rss_mb", "base_rss_mb")}
                    for n, p in phases.items()
                },
                "validation": phases["validate"]["result"],
            }
        return result
    finally:
        if not keep:
            shutil.rmtree(tmp, ignore_errors=True)
        else:
            print(f"kept {tmp}", file=sys.stderr)


def _wait_health(url: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=2):
                return
        except OSError:
            if time.monotonic() > deadline:
                raise RuntimeError(f"{url} did not come up") from None
            time.sleep(0.1)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--phase", nargs=2, metavar=("NAME", "ROOT"), help=argparse.SUPPRESS)
    p.add_argument(
        "--sizes",
        type=lambda s: [int(x) for x in s.split(",")],
        default=[10_000, 100_000],
        help="generation counts (comma-separated)",
    )
    p.add_argument("--million", action="store_true", help="add a run of 10^6 generations")
    p.add_argument("--k-samples", type=int, default=5)
    p.add_argument("--servers", type=int, default=2)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--groups-in-flight", type=int, default=8)
    p.add_argument("--storage-format", default="packed", choices=["packed", "npy", "zarr"])
    p.add_argument("--base-port", type=int, default=9200)
    p.add_argument("--keep", action="store_true", help="keep the run directories")
    p.add_argument(
        "--kill-at",
        type=float,
        default=None,
        metavar="FRACTION",
        help="SIGKILL the orchestrator once this share of the prompts is committed, "
        "then resume it; reports how many committed prompts were redone",
    )
    p.add_argument(
        "--spool-root",
        default="/dev/shm" if os.path.isdir("/dev/shm") else "run",
        help="where the backends write their capture files: a directory (default "
        "/dev/shm, a tmpfs, as `orchestrator run --spool-root` allows), or "
        "'run' for the run's own directory on the disk under test",
    )
    p.add_argument(
        "--task-format",
        default="triviaqa",
        choices=TASK_FORMATS,
        help="the file the prompts are written as: triviaqa (default: the built-in "
        "loader's JSONL) or a --task qa file read through a field mapping "
        "(--question-field question --answers-field answer --id-field qid)",
    )
    p.add_argument(
        "--model-shape",
        default=f"{NUM_LAYERS}:{HIDDEN}",
        type=parse_model_shape,
        metavar="8b|70b|LAYERS:HIDDEN",
        help="the fake model's num_hidden_layers:hidden_size, which the backends' "
        "captures follow: 8b = 32:4096 (33 layer ids), 70b = 80:8192 (81); "
        f"default {NUM_LAYERS}:{HIDDEN}",
    )
    p.add_argument(
        "--profile",
        default="light",
        choices=["light", "integrated", "probes", "full"],
        help="--logging-profile of the run (default light)",
    )
    p.add_argument(
        "--answer-tokens",
        type=int,
        default=12,
        help="tokens per answer (the backends' canned answer, --max-tokens)",
    )
    p.add_argument(
        "--postrun",
        default="true",
        choices=["true", "false"],
        help="run the post-run phases after the run (false: the run only, e.g. for the bytes path)",
    )
    p.add_argument(
        "--synthetic",
        action="store_true",
        help="post-run phases only, on run directories written by the real writer "
        "(no orchestrator, no backend)",
    )
    p.add_argument(
        "--baseline",
        type=Path,
        default=None,
        help="with --synthetic: also run the phases with the code of this checkout "
        "(same directory, copied) and print ratios",
    )
    args = p.parse_args()
    if args.phase:
        _phase(args.phase[0], Path(args.phase[1]))
        return
    sizes = args.sizes + ([1_000_000] if args.million else [])
    results = []
    if args.synthetic:
        for n in sizes:
            r = bench_synthetic(
                n,
                k=args.k_samples,
                workers=args.workers,
                storage_format=args.storage_format,
                baseline=args.baseline,
                keep=args.keep,
            )
            results.append(r)
            print(f"{r['generations']:>8} generations (synthetic, built in {r['build_s']} s)")
            for name in PHASES:
                cur = r["current"]["phases"][name]
                line = (
                    f"    {name:<13} {cur['wall_s']:>8.2f} s  cpu {cur['cpu_s']:>7.2f} s  "
                    f"peak rss {cur['peak_rss_mb']:>7.1f} MB"
                )
                if "baseline" in r:
                    base = r["baseline"]["phases"][name]
                    line += (
                        f"   | baseline cpu {base['cpu_s']:>7.2f} s "
                        f"(x{base['cpu_s'] / max(cur['cpu_s'], 1e-3):.2f})  "
                        f"rss {base['peak_rss_mb']:>7.1f} MB"
                    )
                print(line)
            for label in ("baseline", "current"):
                if label in r:
                    print(
                        f"    {label}: post-run CPU "
                        f"{r[label]['postrun_cpu_ms_per_generation']:.3f} ms/generation, "
                        f"peak RSS {r[label]['postrun_peak_rss_mb']:.0f} MB"
                    )
            sys.stdout.flush()
        print(json.dumps({"bench": "scale", "synthetic": True, "results": results}))
        return
    for n in sizes:
        r = bench_size(
            n,
            k=args.k_samples,
            servers=args.servers,
            workers=args.workers,
            groups_in_flight=args.groups_in_flight,
            base_port=args.base_port,
            storage_format=args.storage_format,
            keep=args.keep,
            kill_at=args.kill_at,
            spool_root=None if args.spool_root == "run" else args.spool_root,
            task_format=args.task_format,
            model_shape=args.model_shape,
            profile=args.profile,
            answer_tokens=args.answer_tokens,
            postrun=args.postrun == "true",
        )
        results.append(r)
        print(
            f"{r['generations']:>8} generations: {r['generations_per_s']:.0f} gen/s, "
            f"CPU {r['cpu_ms_per_generation']:.2f} ms/gen "
            f"(run {r['run_cpu_ms_per_generation']:.2f} + post-run {r['postrun_cpu_ms_per_generation']:.2f}; "
            f"status + retry scan {r['on_demand_cpu_ms_per_generation']:.2f} more), peak RSS run "
            f"{r['run_peak_rss_mb']:.0f} MB / post-run {r['postrun_peak_rss_mb']:.0f} MB, "
            f"server shares {r['server_request_share']}, spool on {r['spool']['filesystem']}, "
            f"task {r['task_format']}"
        )
        bp = r["bytes_path"]
        print(
            f"    bytes: {bp['profile']} at {bp['model_shape']} ({bp['layer_ids']} layer ids), "
            f"{bp['stored_bytes'] / 1e6:.0f} MB stored ({bp['stored_MB_per_generation']} MB/gen), "
            f"{bp['stored_MBps']} MB/s (steady {bp['stored_steady_MBps']}) vs sequential write "
            f"{bp['sequential_write_MBps']} MB/s: {bp['ratio_vs_sequential']} "
            f"(steady {bp['ratio_steady_vs_sequential']}); disk bytes per stored byte "
            f"{bp['disk_bytes_per_stored_byte']} (diskstats {bp['diskstats_bytes_per_stored_byte']}); "
            f"CPU {bp['cpu_s_per_GB']} s/GB (backends {bp['backend_cpu_s_per_GB']})"
        )
        if "sigkill_resume" in r:
            kr = r["sigkill_resume"]
            print(
                f"    SIGKILL with {kr['killed_with_committed_prompts']} prompts committed; "
                f"resume found {kr['resumed_before']} done, ran {kr['resumed_this_session']}, "
                f"redid {kr['redone_prompts']}"
            )
        for name, ph in r["phases"].items():
            print(
                f"    {name:<13} {ph['wall_s']:>8.2f} s  cpu {ph['cpu_s']:>7.2f} s  "
                f"peak rss {ph['peak_rss_mb']:>7.1f} MB "
                f"(after imports {ph['base_rss_mb']:.0f} MB)"
            )
        sys.stdout.flush()
    print(json.dumps({"bench": "scale", "results": results}))


if __name__ == "__main__":
    main()
