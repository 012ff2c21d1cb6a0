"""Generations/s of the embedded server: one request at a time vs many concurrent (same run).

    python bench/bench_serving_batching.py                 # starts its own server (default model)
    python bench/bench_serving_batching.py --url http://127.0.0.1:8000 --concurrency 16

Both phases send the same greedy chat requests (so the same tokens are generated) and the server
is the same process, so the ratio measures what dynamic batching buys. Not part of the tests.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import os
import pathlib
import socket
import subprocess
import sys
import tempfile
import time

import httpx

REPO = pathlib.Path(__file__).resolve().parents[1]
QUESTIONS = [
    "What is the capital of France?", "Who wrote Romeo and Juliet?", "What is photosynthesis?",
    "Name the largest planet in the solar system.", "What is the boiling point of water?",
    "Who painted the Mona Lisa?", "What is the square root of 144?", "What language is spoken in Brazil?",
    "How many continents are there?", "What is DNA?", "Who discovered penicillin?",
    "What is the speed of light?", "What is the tallest mountain on Earth?",
    "Who was the first person on the Moon?", "What is the chemical symbol for gold?",
    "What causes the seasons on Earth?",
]


def start_server(args) -> tuple[subprocess.Popen, str]:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    log = open(os.path.join(tempfile.mkdtemp(prefix="bench-serving-"), "server.log"), "wb")
    cmd = [sys.executable, "-m", "serving", "--port", str(port), "--log-level", "warning",
           "--max-batch-size", str(max(args.concurrency, 1)), "--batch-wait-ms", str(args.batch_wait_ms),
           "--num-threads", str(args.num_threads)]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            sys.exit(f"server exited with {proc.returncode}; see {log.name}")
        try:
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                return proc, url
        except httpx.TransportError:
            time.sleep(0.5)
    proc.kill()
    sys.exit("server did not become healthy")


def run_phase(url: str, prompts: list[str], max_tokens: int, concurrency: int) -> tuple[float, int]:
    def one(question: str) -> int:
        body = {"messages": [{"role": "user", "content": question}], "max_tokens": max_tokens,
                "temperature": 0, "logprobs": True, "top_logprobs": 5}
        resp = httpx.post(url + "/v1/chat/completions", json=body, timeout=600)
        resp.raise_for_status()
        return resp.json()["usage"]["completion_tokens"]

    start = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(concurrency) as pool:
        tokens = sum(pool.map(one, prompts))
    return time.perf_counter() - start, tokens


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", help="use a running server instead of starting one")
    parser.add_argument("--num-prompts", type=int, default=16)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--batch-wait-ms", type=float, default=5.0)
    parser.add_argument("--num-threads", type=int, default=0,
                        help="server torch threads (0: torch default; 1 on an oversubscribed box)")
    args = parser.parse_args()
    prompts = [QUESTIONS[i % len(QUESTIONS)] for i in range(args.num_prompts)]
    proc = None
    url = args.url
    if url is None:
        proc, url = start_server(args)
    try:
        run_phase(url, prompts[:2], 4, 1)  # warm-up
        seq_s, seq_tokens = run_phase(url, prompts, args.max_tokens, 1)
        con_s, con_tokens = run_phase(url, prompts, args.max_tokens, args.concurrency)
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait(30)
    seq_rate, con_rate = len(prompts) / seq_s, len(prompts) / con_s
    print(f"prompts={len(prompts)} max_tokens={args.max_tokens} concurrency={args.concurrency}")
    print(f"one at a time : {seq_rate:7.3f} generations/s  {seq_tokens / seq_s:7.1f} tokens/s  "
          f"({seq_s:.1f} s)")
    print(f"{args.concurrency:2d} concurrent : {con_rate:7.3f} generations/s  "
          f"{con_tokens / con_s:7.1f} tokens/s  ({con_s:.1f} s)")
    print(f"ratio (concurrent / one at a time): {con_rate / seq_rate:.2f}x")


if __name__ == "__main__":
    main()
