import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)
HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:
    sys.path.insert(0, HERE)


def pytest_generate_tests(metafunc):
    """Each format lists its DataLoader cases (spawn is slow: the default format tests it)."""
    if "dataloader_case" in metafunc.fixturenames:
        cases = metafunc.cls.dataloader_cases
        metafunc.parametrize("dataloader_case", cases, ids=[f"{w}-{c}" for w, c in cases])
