def pytest_generate_tests(metafunc):
    """Each format lists its DataLoader cases (spawn is slow: the default format tests it)."""
    if "dataloader_case" in metafunc.fixturenames:
        import pytest

        cases = [
            pytest.param((w, c), marks=pytest.mark.slow) if c == "spawn" else (w, c)
            for w, c in metafunc.cls.dataloader_cases
        ]
        ids = [f"{w}-{c}" for w, c in metafunc.cls.dataloader_cases]
        metafunc.parametrize("dataloader_case", cases, ids=ids)
