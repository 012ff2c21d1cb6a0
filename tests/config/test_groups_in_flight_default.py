"""--groups-in-flight defaults by backend (the embedded engine batches every sequence in flight;
vLLM's default is unchanged) and never enters the fingerprint."""

from hallulog.config.run_config import RunConfig
from hallulog.contracts.ids import fingerprint


def test_default_groups_in_flight_follow_the_backend():
    assert RunConfig().groups_in_flight == 32
    assert RunConfig(backend="vllm").groups_in_flight == 4
    assert RunConfig(groups_in_flight=7).groups_in_flight == 7
    assert RunConfig(backend="vllm", groups_in_flight=7).groups_in_flight == 7


def test_groups_in_flight_leave_the_fingerprint_as_it_was():
    """(The default's value is pinned in tests/tasks/test_study.py.)"""
    default = fingerprint(RunConfig().fingerprint_fields())
    assert default == fingerprint(RunConfig(groups_in_flight=4).fingerprint_fields())
    assert default == fingerprint(RunConfig(groups_in_flight=None).fingerprint_fields())
