"""Any failure at any write of a group's persist leaves the worker directory recoverable.

The fault is injected for real: every ``os.write`` / ``os.fsync`` / ``os.fdatasync`` /
``os.ftruncate`` call of one group's persist is made to fail in turn (EIO, ENOSPC, EDQUOT) or to
"crash" (no handler runs, nothing touches the disk afterwards). After each, the directory must
recover, a resumed persist must complete, and every prompt must be committed exactly once with
its activations readable.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from hallulog.contracts import layout
from hallulog.contracts.jsonl import iter_rows
from hallulog.workers._faults import SimulatedCrash, inject
from hallulog.workers.persist import GenerationRecord, PersistBroken, WorkerDir, recover_worker_dir

from hallulog import storage

LAYERS, HIDDEN, DTYPE = [0, 1], 4, "float16"
PROMPTS = ["a" * 16, "b" * 16, "c" * 16]


def _group(pid: str, k: int = 1) -> tuple[dict, list[GenerationRecord]]:
    gens = []
    for sid in range(k + 1):
        rows = 3 + sid
        acts = np.full((len(LAYERS), rows, HIDDEN), hash((pid, sid)) % 97, dtype=DTYPE)
        gens.append(
            GenerationRecord(
                row={"prompt_id": pid, "sample_id": sid, "text": "x" * 50},
                acts=acts,
                prompt_rows=1,
                response_rows=rows - 1,
                label=1,
                activation_row={
                    "prompt_id": pid,
                    "sample_id": sid,
                    "activation_key": f"{pid}_{sid}",
                },
            )
        )
    return {"prompt_id": pid, "prompt": "q?"}, gens


def _open(root, fmt) -> WorkerDir:
    return WorkerDir(
        root, worker_id=0, storage_format=fmt, layer_ids=LAYERS, hidden_size=HIDDEN, dtype=DTYPE
    )


def _recover(root, fmt) -> set[str]:
    return recover_worker_dir(
        root, storage_format=fmt, layer_ids=LAYERS, hidden_size=HIDDEN, dtype=DTYPE
    )


def _check_exactly_once(root, fmt) -> None:
    prompts = list(iter_rows(root / layout.PROMPT_INDEX))
    assert sorted(r["prompt_id"] for r in prompts) == PROMPTS
    commits = {r["prompt_id"]: r["commit_id"] for r in prompts}
    gens = [g for g in iter_rows(root / layout.GENERATIONS) if g["commit_id"] in commits.values()]
    assert sorted((g["prompt_id"], g["sample_id"]) for g in gens) == [
        (p, s) for p in PROMPTS for s in (0, 1)
    ]
    index = [r for r in iter_rows(root / layout.ACTIVATION_INDEX)]
    keys = [r["activation_key"] for r in index]
    assert sorted(keys) == sorted(f"{p}_{s}" for p in PROMPTS for s in (0, 1)), keys
    reader = storage.open_store(root)
    assert sorted(reader.keys()) == sorted(keys)
    for i, key in enumerate(reader.keys()):
        pid, sid = key.rsplit("_", 1)
        want = hash((pid, int(sid))) % 97
        assert np.all(np.asarray(reader.read(i, 0)) == want)


def _persist_rest(root, fmt, done: set[str]) -> None:
    wd = _open(root, fmt)
    for pid in PROMPTS:
        if pid not in done:
            wd.persist_group(*_group(pid))
    wd.close()


def _count_calls(tmp_path, fmt, op) -> int:
    root = tmp_path / "count"
    wd = _open(root, fmt)
    wd.persist_group(*_group(PROMPTS[0]))
    with inject(op) as plan:
        wd.persist_group(*_group(PROMPTS[1]))
    wd.close()
    return plan.calls


def _run_with_fault(root, fmt, op, n, err) -> None:
    wd = _open(root, fmt)
    wd.persist_group(*_group(PROMPTS[0]))
    crashed = broken = False
    with inject(op, nth=n, err=err) as plan:
        try:
            wd.persist_group(*_group(PROMPTS[1]))
        except SimulatedCrash:
            crashed = True
        except PersistBroken:
            broken = True
        except OSError as exc:
            assert err in str(exc) or exc.errno is not None
        if not crashed and not broken:
            wd.persist_group(*_group(PROMPTS[2]))  # the worker goes on after a rollback
    assert plan.fired == 1
    if not crashed:
        try:
            wd.close()
        except OSError:
            pass
    else:
        wd.writer_lock.release()  # the process "died": the kernel lets go of its flock
    done = _recover(root, fmt)
    assert PROMPTS[0] in done
    _persist_rest(root, fmt, done)
    assert _recover(root, fmt) == set(PROMPTS)
    _check_exactly_once(root, fmt)


@pytest.mark.slow
@pytest.mark.parametrize("fmt", ["packed", "npy", "zarr"])
@pytest.mark.parametrize("op", ["write", "fsync"])
def test_every_nth_call_of_a_group_can_fail(tmp_path, fmt, op):
    total = _count_calls(tmp_path, fmt, op)
    assert total > 0, f"{fmt}: persist made no os.{op} call (fault injection is blind)"
    errs = ["EIO", "ENOSPC", "EDQUOT", "crash"]
    for n in range(1, total + 1):
        for err in errs if fmt == "packed" else ["EIO", "crash"]:
            _run_with_fault(tmp_path / f"{op}{n}{err}", fmt, op, n, err)


@pytest.mark.parametrize("fmt", ["packed", "npy", "zarr"])
def test_nth_write_fails_and_so_does_every_truncate_of_its_rollback(tmp_path, fmt):
    """The rollback's own truncates fail (a dying disk): the worker must stop (PersistBroken)
    or have had nothing to cut, and the next run's recovery must still repair the directory."""
    total = _count_calls(tmp_path, fmt, "write")
    for n in range(1, total + 1):
        root = tmp_path / f"t{n}"
        wd = _open(root, fmt)
        wd.persist_group(*_group(PROMPTS[0]))
        with inject("truncate", every=1, err="EIO"), inject("write", nth=n, err="EIO"):
            with pytest.raises(OSError):
                wd.persist_group(*_group(PROMPTS[1]))
        try:
            wd.close()
        except OSError:
            pass
        done = _recover(root, fmt)
        _persist_rest(root, fmt, done)
        assert _recover(root, fmt) == set(PROMPTS)
        _check_exactly_once(root, fmt)


@pytest.mark.parametrize("fmt", ["packed", "npy"])
def test_rollback_failing_too_stops_and_recovers(tmp_path, fmt):
    """Every write fails (a dead disk): the group's rollback fails, the worker must stop."""
    root = tmp_path / "w"
    wd = _open(root, fmt)
    wd.persist_group(*_group(PROMPTS[0]))
    with inject("any", every=1, err="EIO"):
        with pytest.raises(OSError):
            wd.persist_group(*_group(PROMPTS[1]))
        if wd.broken is not None:
            with pytest.raises(PersistBroken):
                wd.persist_group(*_group(PROMPTS[2]))
    try:
        wd.close()
    except OSError:
        pass
    done = _recover(root, fmt)
    _persist_rest(root, fmt, done)
    assert _recover(root, fmt) == set(PROMPTS)
    _check_exactly_once(root, fmt)


def test_failed_group_does_not_poison_the_next_resume(tmp_path):
    """The reported bug: a failed group's samples stayed committed in the store without index
    lines, and the next resume's rollback raised 'drops only a tail'."""
    root = tmp_path / "w"
    wd = _open(root, "packed")
    wd.persist_group(*_group(PROMPTS[0]))
    with inject("fsync", nth=1, path="prompt_index", err="EIO"):
        with pytest.raises(OSError):
            wd.persist_group(*_group(PROMPTS[1]))
    wd.persist_group(*_group(PROMPTS[2]))
    wd.close()
    assert _recover(root, "packed") == {PROMPTS[0], PROMPTS[2]}
    log = (root / "activations" / "commit.log").read_text().splitlines()
    assert [json.loads(x)["key"] for x in log[1:]] == [
        f"{p}_{s}" for p in (PROMPTS[0], PROMPTS[2]) for s in (0, 1)
    ]
    _persist_rest(root, "packed", {PROMPTS[0], PROMPTS[2]})
    _check_exactly_once(root, "packed")


# ------------------------------------------------------------------ recovery on hostile bytes

from hypothesis import given  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from tests.fuzzing import DOCUMENTED, FUZZ, mutate, mutations, no_hang, snapshot  # noqa: E402


@pytest.fixture(scope="module")
def committed_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("committed") / "worker_0"
    wd = _open(root, "packed")
    for pid in PROMPTS:
        wd.persist_group(*_group(pid))
    wd.close()
    return root


@FUZZ
@given(pick=st.integers(0, 1000), m=mutations)
def test_recovery_of_a_damaged_directory_only_truncates(committed_dir, tmp_path, pick, m):
    """Recovery on damaged files (a JSONL file or the store's commit log) either succeeds or
    raises a documented error naming the file; either way it only ever cuts files (never
    rewrites or deletes committed lines), and on error the prompt index is untouched."""
    import shutil

    root = tmp_path / "w"
    if root.exists():
        shutil.rmtree(root)
    shutil.copytree(committed_dir, root)
    names = [
        layout.PROMPT_INDEX,
        layout.GENERATIONS,
        layout.ACTIVATION_INDEX,
        "activations/commit.log",
    ]
    target = root / names[pick % len(names)]
    target.write_bytes(mutate(target.read_bytes(), m))
    before = snapshot(root)
    try:
        with no_hang():
            done = _recover(root, "packed")
        assert done <= set(PROMPTS)
    except DOCUMENTED as exc:
        assert str(root) in str(exc), exc
        assert (root / layout.PROMPT_INDEX).read_bytes() == before[layout.PROMPT_INDEX] or before[
            layout.PROMPT_INDEX
        ].startswith((root / layout.PROMPT_INDEX).read_bytes())
    after = snapshot(root)
    for name, data in before.items():
        if name.startswith("activations/") and not name.endswith(("commit.log", ".bin")):
            continue  # index arrays and the manifest are rewritten from the commit log
        assert name in after or name.endswith(".bin"), f"recovery deleted {name}"
        if name in after:
            assert data.startswith(after[name]), f"recovery rewrote {name} (not a cut)"
