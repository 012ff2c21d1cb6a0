"""Helpers shared by the status API tests (a module name no other test folder uses)."""

from __future__ import annotations

from hallulog.orchestrator.run.status import StatusBoard


class FakeClock:
    """Monotonic and wall clocks that move only when the test says so."""

    def __init__(self, start: float = 1000.0, wall: float = 1_700_000_000.0) -> None:
        self.t = start
        self.offset = wall - start

    def __call__(self) -> float:
        return self.t

    def wall(self) -> float:
        return self.t + self.offset

    def advance(self, seconds: float) -> None:
        self.t += seconds


def make_board(clock: FakeClock | None = None, **kw) -> StatusBoard:
    args = dict(
        run_id="run-1",
        config_summary={"model": "smollm2-135m", "k_samples": 2},
        fingerprint="ab" * 32,
        artifact_root="/tmp/run-1",
        total_prompts=20,
        skipped=4,
        k_samples=2,
    )
    args.update(kw)
    if clock is not None:
        args.update(clock=clock, wall_clock=clock.wall)
    return StatusBoard(**args)
