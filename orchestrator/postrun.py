"""The CLI's post-run commands and the closing summary of a run."""

from __future__ import annotations

from orchestrator.run import RunResult

__all__ = ["format_result"]


def format_result(result: RunResult) -> str:
    """A few lines a person reads at the end of a run."""
    done = result.done_before + result.done
    labels = result.labels
    graded = labels.get("correct", 0) + labels.get("hallucinated", 0)
    balance = (f"{labels.get('correct', 0)} correct / {labels.get('hallucinated', 0)} "
               f"hallucinated / {labels.get('unlabeled', 0)} unlabeled")
    if graded:
        balance += f" ({100 * labels.get('hallucinated', 0) / graded:.0f}% hallucinated)"
    return "\n".join([
        f"run finished in {result.wall_seconds:.1f} s: {done}/{result.total} prompts done "
        f"({result.done} this session, {result.done_before} before), {len(result.failed)} failed",
        f"labels: {balance}",
        f"artifacts: {result.artifact_root}",
    ])
