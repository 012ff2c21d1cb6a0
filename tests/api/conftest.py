"""Fixtures for the status API tests: a StatusBoard on a fake clock."""

from __future__ import annotations

import pytest
from hallulog.orchestrator.run.status import StatusBoard

from tests.api.status_fixtures import FakeClock, make_board


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def board(clock: FakeClock) -> StatusBoard:
    return make_board(clock, window_s=60.0, history_bucket_s=10.0)
