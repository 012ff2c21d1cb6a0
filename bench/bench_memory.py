"""Memory and speed of the embedded server against a baseline commit's, on the same traffic.

    python -m bench.bench_memory                              # baseline: main's serving/
    python -m bench.bench_memory --baseline-ref bd66845 --questions 96 --rounds 3
    python -m bench.bench_memory --job                        # + the default job, whole tree

Two servers are started as ``python -m orchestrator run`` starts one (``python -m
hallulog.serving`` with a spool directory, every layer id captured, float32), one from this
checkout and one from ``--baseline-ref`` (its package tree exported from git into a temporary
directory and put first on ``PYTHONPATH``: everything it imports is that commit's). Phases,
alternated round by round (medians reported; the machine may be shared, so each server's CPU
seconds are reported beside the wall time and the load average is printed):

- ``job``: the default job's traffic over HTTP as a worker sends it: ``--groups-in-flight``
  groups of one greedy answer and k samples (T 0.7, top-p 0.95, seeded), chat requests of n=1
  with top-5 logprobs and token ids, each captured (``hallulog_capture_rows: response``, the
  integrated profile's rows), each capture file read, hashed and deleted. Every answer's token
  ids and every capture's bytes are compared between the two servers.
- ``light``: ``--light-concurrency`` (8) concurrent greedy chat requests (top-5 logprobs, no
  capture), against transformers' ``generate`` on a left-padded batch of the same prompts in
  this process (every core as intra-op threads).

Each server's peak resident set (``VmHWM``) is read after the job phases. ``--job`` then runs
the README's default job (``python -m hallulog.orchestrator run``) once with each tree and
samples the whole process tree's resident set (orchestrator, server, workers) every 0.2 s; the
two runs' generations (text and token ids) are compared. The last line is one JSON object. Not a
test.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import pathlib
import shutil
import socket
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time

import httpx
import psutil
import tomllib
import torch
from hallulog.serving.model_loader import default_model_dir, load_model
from hallulog.tasks.triviaqa import build_prompt
from safetensors.torch import load_file

from bench.bench_engine_phases import questions_text

REPO = pathlib.Path(__file__).resolve().parents[1]

NAME = "smollm2"
LIGHT = [
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


def export_tree(ref: str, dest: pathlib.Path) -> pathlib.Path:
    """``ref``'s ``hallulog`` package assembled from its rooms (pyproject's package-dir) under
    ``dest``; returns the directory to put on ``PYTHONPATH``."""
    src = dest / "src"
    src.mkdir(parents=True)
    archive = subprocess.run(
        ["git", "archive", "--format=tar", ref], cwd=REPO, check=True, capture_output=True
    ).stdout
    archive_path = dest / "tree.tar"
    archive_path.write_bytes(archive)
    with tarfile.open(archive_path) as tar:
        tar.extractall(src, filter="data")
    mapping = tomllib.loads((src / "pyproject.toml").read_text())["tool"]["setuptools"]
    out = dest / "path"
    shutil.copytree(src / "hallulog", out / "hallulog")
    for package, folder in mapping["package-dir"].items():
        if package.startswith("hallulog."):
            shutil.copytree(src / folder, out / "hallulog" / package.split(".", 1)[1])
    return out


class Server:
    """``python -m hallulog.serving`` as the orchestrator starts it, from ``pythonpath`` (None:
    this checkout)."""

    def __init__(self, label: str, pythonpath, work: pathlib.Path, layers: int, args):
        self.label = label
        self.spool = work / f"spool-{label}"
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{port}"
        argv = [sys.executable, "-m", "hallulog.serving", "--model", str(default_model_dir())]
        argv += ["--host", "127.0.0.1", "--port", str(port), "--spool-dir", str(self.spool)]
        argv += ["--dtype", "float32", "--capture-layers", ",".join(map(str, range(layers)))]
        argv += ["--served-model-name", NAME, "--log-level", "warning", *args]
        env = dict(os.environ)
        if pythonpath is not None:
            env["PYTHONPATH"] = str(pythonpath)
        self.log = open(work / f"server-{label}.log", "wb")  # noqa: SIM115 - the server's life
        self.proc = subprocess.Popen(argv, cwd=work, env=env, stdout=self.log, stderr=self.log)
        while True:
            if self.proc.poll() is not None:
                raise SystemExit(f"{label} server exited; see {self.log.name}")
            try:
                if httpx.get(self.url + "/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        self.ready_rss = psutil.Process(self.proc.pid).memory_info().rss

    def cpu_s(self) -> float:
        t = psutil.Process(self.proc.pid).cpu_times()
        return t.user + t.system

    def peak_rss(self) -> int:
        with open(f"/proc/{self.proc.pid}/status") as fh:
            for line in fh:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
        return 0

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(60)
        self.log.close()


def job_traffic(server: Server, texts: list[str], args, keep=None, against=None) -> dict:
    """The default job's requests: tokens, wall and server CPU seconds, every answer. Capture
    files are moved to ``keep`` (a directory), or compared with the file of the same request in
    ``against`` (bitwise, and the largest difference relative to each layer's largest
    magnitude), else read and deleted."""
    client = httpx.Client(timeout=900, limits=httpx.Limits(max_connections=512))
    answers, captures = {}, {}

    def take(path: str, key: tuple[int, int]) -> None:
        if keep is not None:
            os.replace(path, keep / f"{key[0]}-{key[1]}.safetensors")
        else:
            states = load_file(path)["hidden_states"]
            if against is not None:
                other = against / f"{key[0]}-{key[1]}.safetensors"
                ref = load_file(other)["hidden_states"]
                scale = ref.abs().amax(dim=(0, 2), keepdim=True).clamp(min=1e-30)
                diff = (
                    ((states - ref).abs() / scale).max().item()
                    if ref.shape == states.shape
                    else float("inf")
                )
                captures[key] = (torch.equal(states, ref), diff)
                other.unlink()
            os.remove(path)
        pathlib.Path(path + ".lock").unlink(missing_ok=True)

    def one(q: int, sample: int) -> int:
        body = {
            "model": NAME,
            "messages": build_prompt(texts[q]),
            "temperature": 0.0 if sample == 0 else 0.7,
            "top_p": 1.0 if sample == 0 else 0.95,
            "max_tokens": args.max_tokens,
            "seed": 1000 * q + sample,
            "n": 1,
            "logprobs": True,
            "top_logprobs": 5,
            "return_token_ids": True,
            "kv_transfer_params": {
                "include_output_tokens": True,
                "hallulog_capture_rows": "response",
            },
        }
        reply = client.post(server.url + "/v1/chat/completions", json=body)
        reply.raise_for_status()
        data = reply.json()
        take(data["kv_transfer_params"]["hidden_states_path"], (q, sample))
        ids = data["choices"][0]["token_ids"]
        answers[q, sample] = ids
        return len(ids)

    def group(q: int) -> int:
        with concurrent.futures.ThreadPoolExecutor(args.k + 1) as pool:
            return sum(pool.map(lambda s: one(q, s), range(args.k + 1)))

    cpu, wall = server.cpu_s(), time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(args.groups_in_flight) as pool:
        tokens = sum(pool.map(group, range(len(texts))))
    wall, cpu = time.perf_counter() - wall, server.cpu_s() - cpu
    client.close()
    return {"tokens": tokens, "wall": wall, "cpu": cpu, "answers": answers, "captures": captures}


def light_traffic(server: Server, args) -> tuple[float, list[list[int]]]:
    """``--light-concurrency`` greedy requests at once: tokens/s and the token ids."""
    client = httpx.Client(timeout=900, limits=httpx.Limits(max_connections=64))

    def one(question: str) -> list[int]:
        body = {
            "messages": [{"role": "user", "content": question}],
            "max_tokens": args.max_tokens,
            "temperature": 0,
            "logprobs": True,
            "top_logprobs": 5,
            "return_token_ids": True,
        }
        reply = client.post(server.url + "/v1/chat/completions", json=body)
        reply.raise_for_status()
        return reply.json()["choices"][0]["token_ids"]

    prompts = LIGHT[: args.light_concurrency]
    start = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(len(prompts)) as pool:
        ids = list(pool.map(one, prompts))
    wall = time.perf_counter() - start
    client.close()
    return sum(map(len, ids)) / wall, ids


def generate_batch(loaded, args) -> tuple[float, list[list[int]]]:
    """transformers' ``generate`` on a left-padded batch of the light prompts."""
    tok = loaded.tokenizer
    tok.padding_side = "left"
    texts = [
        tok.apply_chat_template(
            [{"role": "user", "content": q}], add_generation_prompt=True, tokenize=False
        )
        for q in LIGHT[: args.light_concurrency]
    ]
    enc = tok(texts, add_special_tokens=False, return_tensors="pt", padding=True)
    eos = sorted(loaded.eos_token_ids)
    start = time.perf_counter()
    with torch.inference_mode():
        out = loaded.model.generate(
            **enc,
            max_new_tokens=args.max_tokens,
            do_sample=False,
            eos_token_id=eos,
            pad_token_id=tok.pad_token_id if tok.pad_token_id is not None else eos[0],
        )
    wall = time.perf_counter() - start
    ids = []
    for row in out[:, enc["input_ids"].shape[1] :].tolist():
        cut = next((j + 1 for j, t in enumerate(row) if t in loaded.eos_token_ids), len(row))
        ids.append(row[:cut])
    return sum(map(len, ids)) / wall, ids


def run_job(label: str, pythonpath, work: pathlib.Path) -> dict:
    """The README's default job with ``label``'s tree; peak RSS of its process tree."""
    root = work / f"job-{label}"
    env = dict(os.environ)
    if pythonpath is not None:
        env["PYTHONPATH"] = str(pythonpath)
    argv = [sys.executable, "-m", "hallulog.orchestrator", "run", "--artifact-root", str(root)]
    start = time.monotonic()
    proc = subprocess.Popen(
        [*argv, "--progress", "false"],
        cwd=work,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    top, peak, shares = psutil.Process(proc.pid), 0, {}
    while proc.poll() is None:
        try:
            procs = [top, *top.children(recursive=True)]
        except psutil.NoSuchProcess:
            break
        total = 0
        for p in procs:
            try:
                rss = p.memory_info().rss
                kind = "server" if "serving" in " ".join(p.cmdline()) else "other"
            except psutil.Error:
                continue
            total += rss
            shares[kind] = shares.get(kind, 0) + rss
        if total > peak:
            peak, at_peak = total, dict(shares)
        shares = {}
        time.sleep(0.2)
    gens = {}
    path = root / "consolidated" / "generations.jsonl"
    for line in path.read_text().splitlines() if path.exists() else []:
        row = json.loads(line)
        gens[row["prompt_id"], row["sample_id"]] = (row["text"], row.get("token_ids"))
    return {
        "rc": proc.returncode,
        "wall_s": round(time.monotonic() - start, 1),
        "peak_tree_rss_mb": round(peak / 2**20),
        "at_peak_mb": {k: round(v / 2**20) for k, v in at_peak.items()} if peak else {},
        "generations": gens,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--baseline-ref", default="main", help="the commit to compare with")
    parser.add_argument("--questions", type=int, default=96)
    parser.add_argument("--groups-in-flight", type=int, default=32)
    parser.add_argument("--k", type=int, default=5)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--light-concurrency", type=int, default=8)
    parser.add_argument("--server-args", default="", help="more flags for this tree's server")
    parser.add_argument("--phases", default="job,light", help="of the servers: job, light")
    parser.add_argument("--job", action="store_true", help="also run the default job with each")
    args = parser.parse_args()
    load_before = os.getloadavg()
    work = pathlib.Path(tempfile.mkdtemp(prefix="bench-memory-"))
    base_path = export_tree(args.baseline_ref, work / "baseline")
    loaded = load_model("default")
    layers = loaded.model.config.num_hidden_layers + 1
    texts = questions_text(args.questions)
    servers = {
        "baseline": Server("baseline", base_path, work, layers, []),
        "current": Server("current", None, work, layers, args.server_args.split()),
    }
    jobs: dict[str, list[dict]] = {name: [] for name in servers}
    light: dict[str, list[float]] = {name: [] for name in [*servers, "generate"]}
    light_ids: dict[str, list] = {}
    try:
        phases = args.phases.split(",")
        keep = work / "captures"
        keep.mkdir()
        for r in range(args.rounds if "job" in phases else 0):
            for name, server in servers.items():
                first = {"keep": keep} if name == "baseline" else {"against": keep}
                out = job_traffic(server, texts, args, **(first if r == 0 else {}))
                jobs[name].append(out)
                print(
                    f"round {r + 1} job   {name:>8}: {out['tokens']} tokens, "
                    f"{out['tokens'] / out['wall']:.1f} tokens/s, "
                    f"{out['tokens'] / out['cpu']:.1f} per server CPU-s",
                    flush=True,
                )
        peaks = {name: server.peak_rss() for name, server in servers.items()}
        generate_threads = len(os.sched_getaffinity(0))
        torch.set_num_threads(generate_threads)
        generate_batch(loaded, argparse.Namespace(**{**vars(args), "max_tokens": 4}))  # warm-up
        for r in range(args.rounds if "light" in phases else 0):
            for name, server in servers.items():
                rate, light_ids[name] = light_traffic(server, args)
                light[name].append(rate)
            rate, light_ids["generate"] = generate_batch(loaded, args)
            light["generate"].append(rate)
            print(
                f"round {r + 1} light: "
                + ", ".join(f"{k} {v[-1]:.1f}" for k, v in light.items())
                + " tokens/s",
                flush=True,
            )
        ready = {name: server.ready_rss for name, server in servers.items()}
    finally:
        for server in servers.values():
            server.stop()
    summary: dict = {"args": vars(args), "load_average_start": round(load_before[0], 2)}
    ratios: dict = {}
    same: dict = {}
    for name, rows in jobs.items():
        summary[name] = {
            "peak_rss_mb": round(peaks[name] / 2**20),
            "ready_rss_mb": round(ready[name] / 2**20),
        }
        if rows:
            summary[name]["tokens_per_s"] = round(
                statistics.median(o["tokens"] / o["wall"] for o in rows), 1
            )
            summary[name]["tokens_per_cpu_s"] = round(
                statistics.median(o["tokens"] / o["cpu"] for o in rows), 1
            )
        if light[name]:
            summary[name]["light_tokens_per_s"] = round(statistics.median(light[name]), 1)
    ratios["peak_rss"] = round(peaks["current"] / peaks["baseline"], 3)
    if jobs["current"]:
        for key in ("tokens_per_s", "tokens_per_cpu_s"):
            ratios[key] = round(summary["current"][key] / summary["baseline"][key], 3)
        base, cur = jobs["baseline"][0], jobs["current"][0]
        equal = sum(cur["answers"][key] == ids for key, ids in base["answers"].items())
        same["answers"] = f"{equal}/{len(base['answers'])}"
        bitwise = sum(ok for ok, _ in cur["captures"].values())
        same["captures_bitwise"] = f"{bitwise}/{len(cur['captures'])}"
        same["captures_max_relative_difference"] = max(
            (d for _, d in cur["captures"].values()), default=0.0
        )
    if light["generate"]:
        generate_rate = statistics.median(light["generate"])
        summary["generate_light_tokens_per_s"] = round(generate_rate, 1)
        ratios["light_vs_generate"] = {
            name: round(statistics.median(light[name]) / generate_rate, 3) for name in servers
        }
        same["light_greedy_vs_generate"] = {
            name: light_ids[name] == light_ids["generate"] for name in servers
        }
    summary["ratios"], summary["same"] = ratios, same
    if args.job:
        runs = {
            "baseline": run_job("baseline", base_path, work),
            "current": run_job("current", None, work),
        }
        gens = [run.pop("generations") for run in runs.values()]
        same = sum(gens[1].get(key) == value for key, value in gens[0].items())
        summary["job"] = {**runs, "same_generations": f"{same}/{len(gens[0])}"}
    summary["load_average_end"] = round(os.getloadavg()[0], 2)
    shutil.rmtree(work, ignore_errors=True)
    for name in servers:
        print(f"{name:>8}: {summary[name]}")
    print(f"ratios current/baseline: {summary['ratios']}; same: {summary['same']}")
    if args.job:
        for name, run in summary["job"].items():
            print(f"job {name}: {run}")
    print(f"load average {summary['load_average_start']} -> {summary['load_average_end']}")
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
