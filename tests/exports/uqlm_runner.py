"""Runs UQLM's own scorers on a ``hallulog export uqlm`` directory; executed by the UQLM test in
UQLM's own virtual environment (no hallulog there), so it reads the export with ``json`` alone.

    python uqlm_runner.py EXPORT_DIR SENTENCE_TRANSFORMER_DIR OUT.json
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

WHITE_BOX = [
    "sequence_probability",
    "min_probability",
    "mean_token_negentropy",
    "min_token_negentropy",
    "probability_margin",
    "monte_carlo_probability",
    "consistency_and_confidence",
]
BLACK_BOX = ["exact_match", "cosine_sim"]


def main() -> None:
    export, st_dir, out = Path(sys.argv[1]), sys.argv[2], Path(sys.argv[3])
    import torch

    torch.set_num_threads(1)  # one short text per call: more threads only contend (7x slower)
    from uqlm import BlackBoxUQ, WhiteBoxUQ

    manifest = json.loads((export / "manifest.json").read_text())
    rows = [json.loads(line) for line in (export / "uqlm.jsonl").read_text().splitlines()]
    kw = {
        "prompts": [r["prompt"] for r in rows],
        "responses": [r["response"] for r in rows],
        "sampled_responses": [r["sampled_responses"] for r in rows],
    }
    wb = WhiteBoxUQ(
        scorers=WHITE_BOX, top_k_logprobs=manifest["top_k"], sentence_transformer=st_dir
    )
    res = asyncio.run(
        wb.score(
            logprobs_results=[r["logprobs"] for r in rows],
            sampled_logprobs_results=[r["sampled_logprobs"] for r in rows],
            show_progress_bars=False,
            **kw,
        )
    ).to_dict()["data"]
    bb = BlackBoxUQ(scorers=BLACK_BOX, sentence_transformer=st_dir)
    res_b = bb.score(
        responses=kw["responses"],
        sampled_responses=kw["sampled_responses"],
        show_progress_bars=False,
    ).to_dict()["data"]
    scores = {k: [float(x) for x in res[k]] for k in WHITE_BOX}
    scores.update({k: [float(x) for x in res_b[k]] for k in BLACK_BOX})
    out.write_text(json.dumps({"prompt_ids": [r["prompt_id"] for r in rows], "scores": scores}))


if __name__ == "__main__":
    main()
