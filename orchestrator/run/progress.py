"""The run's progress bar: done/total, generations/s, tokens/s, ETA, failures.

After a resume the bar starts at the work already done; rates count only this session's work.
"""

from __future__ import annotations

import time

from tqdm import tqdm

__all__ = ["Progress", "describe_capture_failures"]


class Progress:
    """A tqdm bar over prompt groups with generation and token rates in its postfix."""

    def __init__(self, total: int, initial: int = 0, *, enabled: bool = True) -> None:
        self._bar = tqdm(
            total=total,
            initial=initial,
            unit="prompt",
            desc="prompts",
            disable=not enabled,
            dynamic_ncols=True,
            smoothing=0.1,
        )
        self._start = time.monotonic()
        self.generations = 0
        self.tokens = 0
        self.failed = 0
        self.capture_errors = 0
        self.capture_reasons: dict[str, int] = {}
        self.no_answer = 0

    def advance(
        self,
        *,
        generations: int,
        tokens: int,
        capture_errors: int = 0,
        capture_reasons: dict[str, int] | None = None,
        no_answer: int = 0,
    ) -> None:
        """One prompt group done (``capture_errors``: its samples without activations;
        ``capture_reasons``: those whose rows failed the check, per reason; ``no_answer``: its
        generations whose reasoning never closed)."""
        self.capture_errors += capture_errors
        self.no_answer += no_answer
        for reason, n in (capture_reasons or {}).items():
            self.capture_reasons[reason] = self.capture_reasons.get(reason, 0) + n
        self.generations += generations
        self.tokens += tokens
        self._bar.update(1)
        self._refresh()

    def fail(self) -> None:
        """One prompt group failed (recorded in errors.jsonl)."""
        self.failed += 1
        self._refresh()

    def _refresh(self) -> None:
        elapsed = max(time.monotonic() - self._start, 1e-6)
        postfix = {
            "gen/s": f"{self.generations / elapsed:.2f}",
            "tok/s": f"{self.tokens / elapsed:.1f}",
            "failed": self.failed,
            "capture_failed": describe_capture_failures(self.capture_errors, self.capture_reasons),
        }
        if self.no_answer:  # reasoning models only: generations whose reasoning never closed
            postfix["no_answer"] = self.no_answer
        self._bar.set_postfix(postfix, refresh=True)

    def close(self) -> None:
        self._bar.close()


def describe_capture_failures(count: int, reasons: dict[str, int]) -> str:
    """``"3"``, or ``"3 (2 capture_zeros, 1 capture_nonfinite)"`` when some captures failed the
    row check."""
    if not any(reasons.values()):
        return str(count)
    named = ", ".join(f"{n} {reason}" for reason, n in sorted(reasons.items()) if n)
    return f"{count} ({named})"
