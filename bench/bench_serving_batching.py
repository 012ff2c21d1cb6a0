"""Tokens/s of the embedded server under concurrent greedy requests vs transformers ``generate``.

    python bench/bench_serving_batching.py                 # starts its own server (default model)
    python bench/bench_serving_batching.py --max-tokens 64 --rounds 5 --num-threads 2

Phases, alternated round by round in one run (medians reported, the machine may be shared):
``server``: ``--concurrency`` concurrent greedy chat requests (top-5 logprobs, as a run asks)
to the embedded server; ``generate``: plain transformers ``generate`` (greedy, same
``max_new_tokens``) on a left-padded batch of the same chat prompts, in this process with the
same torch thread count; ``one``: the same requests one at a time (what batching buys). Tokens
counted are the completion tokens (up to EOS) in every phase, and the generated ids of the
server and of ``generate`` are compared. The last line is one JSON object. Not part of the tests.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import pathlib
import socket
import statistics
import subprocess
import sys
import tempfile
import time

import httpx

REPO = pathlib.Path(__file__).resolve().parents[1]
QUESTIONS = [
    "What is the capital of France?",
    "Who wrote Romeo and Juliet?",
    "What is photosynthesis?",
    "Name the largest planet in the solar system.",
    "What is the boiling point of water?",
    "Who painted the Mona Lisa?",
    "What is the square root of 144?",
    "What language is spoken in Brazil?",
    "How many continents are there?",
    "What is DNA?",
    "Who discovered penicillin?",
    "What is the speed of light?",
    "What is the tallest mountain on Earth?",
    "Who was the first person on the Moon?",
    "What is the chemical symbol for gold?",
    "What causes the seasons on Earth?",
]


def start_server(args) -> tuple[subprocess.Popen, str]:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    log = open(os.path.join(tempfile.mkdtemp(prefix="bench-serving-"), "server.log"), "wb")
    cmd = [
        sys.executable,
        "-m",
        "hallulog.serving",
        "--port",
        str(port),
        "--log-level",
        "warning",
        "--max-batch-size",
        str(max(args.concurrency, 1)),
        "--batch-wait-ms",
        str(args.batch_wait_ms),
        "--num-threads",
        str(args.num_threads),
    ]
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


def run_phase(
    url: str, prompts: list[str], max_tokens: int, concurrency: int
) -> tuple[float, int, list[list[int]]]:
    client = httpx.Client(timeout=600, limits=httpx.Limits(max_connections=concurrency))

    def one(question: str) -> list[int]:
        body = {
            "messages": [{"role": "user", "content": question}],
            "max_tokens": max_tokens,
            "temperature": 0,
            "logprobs": True,
            "top_logprobs": 5,
            "return_token_ids": True,
        }
        resp = client.post(url + "/v1/chat/completions", json=body)
        resp.raise_for_status()
        choice = resp.json()["choices"][0]
        return choice.get("token_ids") or [0] * resp.json()["usage"]["completion_tokens"]

    start = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(concurrency) as pool:
        ids = list(pool.map(one, prompts))
    wall = time.perf_counter() - start
    client.close()
    return wall, sum(len(i) for i in ids), ids


class Generate:
    """Plain transformers ``generate`` on one left-padded batch of the chat prompts."""

    def __init__(self, num_threads: int):
        import torch

        sys.path.insert(0, str(REPO))
        from hallulog.serving.model_loader import load_model

        if num_threads:
            torch.set_num_threads(num_threads)
        self.torch = torch
        self.loaded = load_model("default")
        self.tok = self.loaded.tokenizer
        self.tok.padding_side = "left"

    def run(self, prompts: list[str], max_tokens: int) -> tuple[float, int, list[list[int]]]:
        texts = [
            self.tok.apply_chat_template(
                [{"role": "user", "content": q}], add_generation_prompt=True, tokenize=False
            )
            for q in prompts
        ]
        enc = self.tok(texts, add_special_tokens=False, return_tensors="pt", padding=True)
        eos = sorted(self.loaded.eos_token_ids)
        pad = self.tok.pad_token_id if self.tok.pad_token_id is not None else eos[0]
        start = time.perf_counter()
        with self.torch.inference_mode():
            out = self.loaded.model.generate(
                **enc,
                max_new_tokens=max_tokens,
                do_sample=False,
                eos_token_id=eos,
                pad_token_id=pad,
            )
        wall = time.perf_counter() - start
        ids = []
        for row in out[:, enc["input_ids"].shape[1] :].tolist():
            cut = next(
                (j + 1 for j, t in enumerate(row) if t in self.loaded.eos_token_ids), len(row)
            )
            ids.append(row[:cut])
        return wall, sum(len(i) for i in ids), ids


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", help="use a running server instead of starting one")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--batch-wait-ms", type=float, default=5.0)
    parser.add_argument(
        "--num-threads",
        type=int,
        default=0,
        help="torch threads of the server and of generate (0: torch default)",
    )
    parser.add_argument("--skip-one", action="store_true", help="skip the one-at-a-time phase")
    args = parser.parse_args()
    prompts = QUESTIONS[: args.concurrency]
    proc = None
    url = args.url
    if url is None:
        proc, url = start_server(args)
    gen = Generate(args.num_threads)
    results: dict[str, list[tuple[float, int]]] = {"server": [], "generate": [], "one": []}
    same = None
    try:
        run_phase(url, prompts[:2], 4, 2)  # warm-up
        gen.run(prompts[:2], 4)
        for _ in range(args.rounds):
            s_wall, s_tok, s_ids = run_phase(url, prompts, args.max_tokens, args.concurrency)
            g_wall, g_tok, g_ids = gen.run(prompts, args.max_tokens)
            results["server"].append((s_wall, s_tok))
            results["generate"].append((g_wall, g_tok))
            same = s_ids == g_ids if same is None else same and s_ids == g_ids
            if not args.skip_one:
                o_wall, o_tok, _ = run_phase(url, prompts, args.max_tokens, 1)
                results["one"].append((o_wall, o_tok))
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait(30)
    rate = {k: statistics.median(tok / wall for wall, tok in v) for k, v in results.items() if v}
    print(
        f"prompts={len(prompts)} max_tokens={args.max_tokens} concurrency={args.concurrency} "
        f"rounds={args.rounds} threads={args.num_threads or 'default'} cpus={os.cpu_count()}"
    )
    for name, label in (
        ("server", f"server, {args.concurrency} concurrent"),
        ("generate", f"transformers generate, batch {len(prompts)}"),
        ("one", "server, one at a time"),
    ):
        if name in rate:
            print(f"{label:38}: {rate[name]:7.1f} tokens/s (median of {len(results[name])})")
    ratio = rate["server"] / rate["generate"]
    print(f"ratio server / generate: {ratio:.2f}   same greedy tokens: {same}")
    out = {
        "bench": "serving_batching",
        "max_tokens": args.max_tokens,
        "concurrency": args.concurrency,
        "rounds": args.rounds,
        "cpus": os.cpu_count(),
        "threads": args.num_threads,
        "server_tok_s": round(rate["server"], 1),
        "generate_tok_s": round(rate["generate"], 1),
        "ratio_server_vs_generate": round(ratio, 3),
        "same_tokens": same,
        "runs": {k: [round(tok / wall, 1) for wall, tok in v] for k, v in results.items()},
    }
    if "one" in rate:
        out["one_at_a_time_tok_s"] = round(rate["one"], 1)
        out["ratio_concurrent_vs_one"] = round(rate["server"] / rate["one"], 3)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
