"""Throughput of hidden-state capture strategies on vLLM, against plain generation, in one run.

    python bench/bench_vllm_capture.py [--python VENV/bin/python] [--json out.json]

Strategies (docs/vllm.md):

- ``plain``: a server without extraction; generation only (the baseline).
- ``a``: one server with extraction on; every generation request carries
  ``kv_transfer_params.include_output_tokens`` and the client reads and deletes the file.
- ``b``: generation on the plain server, then a capture phase of prefill-only ``/v1/completions``
  (prompt + response token ids, ``max_tokens=1``) on an extraction server; its cost is the
  plain generation time plus the capture phase time (on GPUs: plain servers for the generation
  phase, then the same GPUs restarted with extraction for the capture phase).
- ``c``: one extraction server; generation without ``include_output_tokens`` (the server still
  writes a prompt-only file, which is deleted), then a prefill-only capture of prompt + response
  on the same server (its prefix cache holds most of those tokens already).

Every request asks for what a run asks for (top-5 logprobs, token ids, T=0.7 with a seed) and
generates exactly ``--max-tokens`` tokens (``ignore_eos``), so token counts are equal across
strategies. Both servers are up during the measurement and the strategies alternate round by round
(medians reported), so a shared machine's load drifts into all of them alike; startup times are
reported.
Also: the capture bytes each strategy moved through the spool (file sizes), its capture MB/s,
and a sequential write of the same bytes into the spool directory (no fsync: the connector does
not sync either) as the disk bound, so the ratio says whether bytes or the engine limit capture.
Prints a table; the last line is one JSON object (``--json`` also writes it to a file).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from hallulog.backends.vllm import vllm_server_command, vllm_server_env  # noqa: E402

QUESTIONS = [
    "What is the capital of France?",
    "Who wrote Pride and Prejudice?",
    "How many legs does a spider have?",
    "What is the boiling point of water at sea level?",
    "Which planet is known as the Red Planet?",
    "What is the largest ocean on Earth?",
    "Who painted the Mona Lisa?",
    "What gas do plants absorb from the air?",
]
MODEL = "smollm2"


def start_server(args, port: int, capture: bool, spool: Path, log_path: Path):
    argv = vllm_server_command(
        args.model_dir,
        host="127.0.0.1",
        port=port,
        layer_ids=list(range(args.num_layers + 1)) if capture else None,
        spool_dir=spool if capture else None,
        dtype=args.dtype,
        served_model_name=MODEL,
        python=args.python,
        extra_args=["--max-model-len", "2048"],
    )
    env = vllm_server_env(os.environ, gpu=None, cache_dir=args.cache_dir)
    for name in ("VLLM_CACHE_ROOT", "TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR", "TMPDIR"):
        Path(env[name]).mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            argv, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
    url = f"http://127.0.0.1:{port}"
    while True:
        if proc.poll() is not None:
            raise SystemExit(f"server exited ({proc.returncode}); see {log_path}")
        try:
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                return proc, url, time.monotonic() - t0
        except httpx.HTTPError:
            pass
        time.sleep(1)


def stop_server(proc) -> None:
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    except ProcessLookupError:
        pass


SPOOL_BYTES: dict[str, int] = {}  # strategy -> bytes of capture files taken


def take(path: str, strategy: str | None = None) -> int:
    """Read a capture file as the worker does (wait on the lock, load, delete); its row count."""
    import fcntl

    from safetensors import safe_open

    lock = path + ".lock"
    if os.path.exists(lock):
        with open(lock) as fh:
            fcntl.flock(fh, fcntl.LOCK_SH)
    with safe_open(path, "pt") as f:
        rows = f.get_slice("hidden_states").get_shape()[0]
        f.get_tensor("hidden_states")
    if strategy:
        SPOOL_BYTES[strategy] = SPOOL_BYTES.get(strategy, 0) + os.path.getsize(path)
    os.remove(path)
    if os.path.exists(lock):
        os.remove(lock)
    return rows


def generate(
    url: str,
    jobs,
    max_tokens: int,
    streams: int,
    capture: bool,
    spooled: bool,
    strategy: str | None = None,
):
    """Run chat generations; returns (wall seconds, completion tokens, [(prompt ids, response ids)])."""

    def one(job):
        question, seed = job
        body = {
            "model": MODEL,
            "messages": [{"role": "user", "content": question}],
            "max_tokens": max_tokens,
            "temperature": 0.7,
            "seed": seed,
            "ignore_eos": True,
            "logprobs": True,
            "top_logprobs": 5,
            "return_token_ids": True,
        }
        if capture:
            body["kv_transfer_params"] = {"include_output_tokens": True}
        r = httpx.post(url + "/v1/chat/completions", json=body, timeout=600)
        r.raise_for_status()
        resp = r.json()
        prompt, response = resp["prompt_token_ids"], resp["choices"][0]["token_ids"]
        if spooled:  # an extraction server writes a file for every request
            rows = take(resp["kv_transfer_params"]["hidden_states_path"], strategy)
            if capture and rows != len(prompt) + len(response) - 1:
                raise AssertionError(
                    f"capture has {rows} rows, expected {len(prompt) + len(response) - 1}"
                )
        return prompt, response

    t0 = time.monotonic()
    with ThreadPoolExecutor(streams) as pool:
        pairs = list(pool.map(one, jobs))
    return time.monotonic() - t0, sum(len(r) for _, r in pairs), pairs


def prefill_capture(url: str, pairs, streams: int, strategy: str | None = None) -> float:
    def one(pair):
        ids = pair[0] + pair[1]
        r = httpx.post(
            url + "/v1/completions",
            json={"model": MODEL, "prompt": ids, "max_tokens": 1, "temperature": 0},
            timeout=600,
        )
        r.raise_for_status()
        rows = take(r.json()["kv_transfer_params"]["hidden_states_path"], strategy)
        if rows != len(ids):
            raise AssertionError(f"prefill capture has {rows} rows, expected {len(ids)}")

    t0 = time.monotonic()
    with ThreadPoolExecutor(streams) as pool:
        list(pool.map(one, pairs))
    return time.monotonic() - t0


def disk_write_rate(directory: Path, nbytes: int) -> float:
    """Bytes/s of one sequential write of ``nbytes`` into ``directory`` (then the file is removed)."""
    import numpy as np

    buf = np.random.default_rng(0).integers(0, 255, min(nbytes, 64 << 20), dtype=np.uint8)
    path = directory / "disk_probe.bin"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    t0 = time.perf_counter()
    done = 0
    while done < nbytes:
        done += os.write(fd, memoryview(buf)[: min(len(buf), nbytes - done)])
    wall = time.perf_counter() - t0
    os.close(fd)
    os.unlink(path)
    return nbytes / wall


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--python", default=sys.executable, help="interpreter of the vLLM venv")
    parser.add_argument(
        "--model-dir",
        default=None,
        help="default: hallulog.serving.model_loader.default_model_dir()",
    )
    parser.add_argument(
        "--num-layers", type=int, default=30, help="decoder layers (ids 0..N captured)"
    )
    parser.add_argument("--dtype", default="float32")
    parser.add_argument(
        "--cache-dir", default=None, help="server cache root (default: hallulog cache/vllm-cpu)"
    )
    parser.add_argument("--streams", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--requests-per-stream", type=int, default=3)
    parser.add_argument("--max-tokens", type=int, default=48)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--port", type=int, default=8310)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    from hallulog.serving.model_loader import cache_dir, default_model_dir

    args.model_dir = args.model_dir or str(default_model_dir())
    args.cache_dir = args.cache_dir or str(cache_dir() / "vllm-cpu")
    work = Path(tempfile.mkdtemp(prefix="bench_vllm_"))
    spool = work / "spool"
    spool.mkdir()

    workloads = {}
    for streams in args.streams:
        n = streams * args.requests_per_stream
        workloads[streams] = [(QUESTIONS[i % len(QUESTIONS)], i) for i in range(n)]
    warm = [(QUESTIONS[0], 10_000 + i) for i in range(2)]
    results: dict = {"startup_s": {}, "rounds": args.rounds, "runs": []}

    # Both servers stay up (one idles while the other is measured) and the strategies alternate
    # round by round, so load from other jobs on a shared machine drifts into every strategy
    # alike; the table reports medians over the rounds.
    servers = []
    try:
        for name, capture, port in (("plain", False, args.port), ("capture", True, args.port + 1)):
            proc, url, results["startup_s"][name] = start_server(
                args, port, capture, spool, work / f"{name}.log"
            )
            servers.append(proc)
            generate(url, warm, args.max_tokens, 1, capture=capture, spooled=capture)
        plain_url, capture_url = (
            f"http://127.0.0.1:{args.port}",
            f"http://127.0.0.1:{args.port + 1}",
        )
        walls: dict[tuple[str, int], list[float]] = {}
        tokens: dict[tuple[str, int], int] = {}

        def record(name, streams, wall, n_tokens):
            walls.setdefault((name, streams), []).append(wall)
            tokens[(name, streams)] = n_tokens

        for _ in range(args.rounds):
            for streams, jobs in workloads.items():
                wall_p, tok_p, pairs = generate(
                    plain_url, jobs, args.max_tokens, streams, capture=False, spooled=False
                )
                wall_a, tok_a, _ = generate(
                    capture_url,
                    jobs,
                    args.max_tokens,
                    streams,
                    capture=True,
                    spooled=True,
                    strategy=f"a/{streams}",
                )
                wall_cap = prefill_capture(capture_url, pairs, streams, f"b/{streams}")
                wall_c, tok_c, pairs_c = generate(
                    capture_url,
                    jobs,
                    args.max_tokens,
                    streams,
                    capture=False,
                    spooled=True,
                    strategy=f"c/{streams}",
                )
                wall_c += prefill_capture(capture_url, pairs_c, streams, f"c/{streams}")
                record("plain", streams, wall_p, tok_p)
                record("a: include_output_tokens", streams, wall_a, tok_a)
                record("b: plain gen + prefill capture", streams, wall_p + wall_cap, tok_p)
                record("   (b's capture phase alone)", streams, wall_cap, 0)
                record("c: extraction gen + prefill capture", streams, wall_c, tok_c)
    finally:
        for proc in servers:
            stop_server(proc)

    for (name, streams), samples in walls.items():
        wall = statistics.median(samples)
        wall_p = statistics.median(walls[("plain", streams)])
        n = len(workloads[streams])
        results["runs"].append(
            {
                "strategy": name,
                "streams": streams,
                "requests": n,
                "wall_s": round(wall, 3),
                "wall_s_rounds": [round(w, 3) for w in samples],
                "gen_per_s": round(n / wall, 3),
                "tok_per_s": round(tokens[(name, streams)] / wall, 1),
                "vs_plain": round(wall_p / wall, 3),
            }
        )
    results["runs"].sort(key=lambda r: r["streams"])
    leftovers = sorted(os.listdir(spool))
    # the disk bound: the same bytes as strategy a's capture files, written sequentially
    top = max(args.streams)
    a_bytes = SPOOL_BYTES.get(f"a/{top}", 0) // max(args.rounds, 1)
    disk = disk_write_rate(spool, max(a_bytes, 1 << 20))
    results["disk_write_MBps"] = round(disk / 1e6, 1)
    for run in results["runs"]:
        key = {"a": "a", "b": "b", "c": "c"}.get(run["strategy"][:1])
        if key and f"{key}/{run['streams']}" in SPOOL_BYTES and run["strategy"][:1] != " ":
            nbytes = SPOOL_BYTES[f"{key}/{run['streams']}"] / args.rounds
            run["capture_MB"] = round(nbytes / 1e6, 1)
            run["capture_MBps"] = round(nbytes / run["wall_s"] / 1e6, 1)
            run["capture_vs_disk"] = round(nbytes / run["wall_s"] / disk, 3)
    best = max(
        (r for r in results["runs"] if r["streams"] == top and r["strategy"][:1] in "abc"),
        key=lambda r: r["vs_plain"],
    )
    results["best"] = {
        "strategy": best["strategy"],
        "streams": top,
        "vs_plain": best["vs_plain"],
        "capture_vs_disk": best.get("capture_vs_disk"),
    }

    print(
        f"model {args.model_dir} ({args.dtype}), {args.max_tokens} tokens per generation, "
        f"layer ids 0..{args.num_layers}, median of {args.rounds} rounds"
    )
    print(
        f"startup: plain {results['startup_s']['plain']:.1f} s, "
        f"capture {results['startup_s']['capture']:.1f} s"
    )
    print(
        f"{'strategy':34} {'streams':>7} {'reqs':>5} {'wall s':>8} {'gen/s':>7} {'tok/s':>8} {'vs plain':>9}"
    )
    for run in results["runs"]:
        print(
            f"{run['strategy']:34} {run['streams']:>7} {run['requests']:>5} {run['wall_s']:>8.2f} "
            f"{run['gen_per_s']:>7.2f} {run['tok_per_s']:>8.1f} {run['vs_plain']:>9.2f}"
        )
    print(
        f"disk write (same bytes as a's files, sequential, no fsync): {results['disk_write_MBps']} MB/s"
    )
    for run in results["runs"]:
        if "capture_MBps" in run:
            print(
                f"  {run['strategy']:34} {run['streams']:>3} streams: {run['capture_MB']} MB of capture files, "
                f"{run['capture_MBps']} MB/s = {run['capture_vs_disk']:.2f} of the disk write"
            )
    print(f"best at {top} streams: {best['strategy']}: {best['vs_plain']:.2f} of plain generation")
    print(f"spool files left: {len(leftovers)}")
    results.update(
        bench="vllm_capture",
        model_dir=args.model_dir,
        dtype=args.dtype,
        max_tokens=args.max_tokens,
        cpus=os.cpu_count(),
    )
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))
    print(json.dumps(results))


if __name__ == "__main__":
    main()
