"""Group commit: several prompt groups committed by one ``persist_groups`` call (one fsync per
file for the lot), and the worker's batching of the groups that finish while a commit is on
the disk.

Faults are injected for real (``hallulog.workers._faults``); recovery runs on the bytes left behind.
"""

from __future__ import annotations

import asyncio

import pytest
from hallulog.contracts import layout
from hallulog.contracts.jsonl import iter_rows
from hallulog.workers._faults import SimulatedCrash, inject

from tests.workers.test_persist_faults import _group, _open, _recover

PIDS = [c * 16 for c in "defgh"]


def test_one_call_commits_every_group_with_one_fsync_per_file(tmp_path):
    alone, together = tmp_path / "alone", tmp_path / "together"
    wd = _open(alone, "packed")
    with inject("fsync") as one_group:
        wd.persist_group(*_group(PIDS[0]))
    wd.close()
    wd = _open(together, "packed")
    with inject("fsync") as three_groups:
        wd.persist_groups([_group(p) for p in PIDS[:3]])
    wd.close()
    assert three_groups.calls == one_group.calls > 0
    prompts = list(iter_rows(together / layout.PROMPT_INDEX))
    assert [r["prompt_id"] for r in prompts] == PIDS[:3]
    assert len({r["commit_id"] for r in prompts}) == 3  # one commit id per group
    commit_of = {r["prompt_id"]: r["commit_id"] for r in prompts}
    for name in (layout.GENERATIONS, layout.ACTIVATION_INDEX):
        rows = list(iter_rows(together / name))
        assert [r["prompt_id"] for r in rows] == [p for p in PIDS[:3] for _ in (0, 1)]
        assert all(r["commit_id"] == commit_of[r["prompt_id"]] for r in rows)
    assert _recover(together, "packed") == set(PIDS[:3])


@pytest.mark.parametrize("err", ["EIO", "crash"])
def test_a_fault_anywhere_in_a_batch_loses_no_committed_group(tmp_path, err):
    """Every write of a three-group batch fails in turn: the groups before the batch stay
    committed, the batch is all or nothing, and a resumed commit completes every group."""
    count_root = tmp_path / "count"
    wd = _open(count_root, "packed")
    with inject("write") as plan:
        wd.persist_groups([_group(p) for p in PIDS[1:4]])
    wd.close()
    for n in range(1, plan.calls + 1):
        root = tmp_path / f"w{n}"
        wd = _open(root, "packed")
        wd.persist_group(*_group(PIDS[0]))
        with inject("write", nth=n, err=err):
            with pytest.raises((OSError, SimulatedCrash)):
                wd.persist_groups([_group(p) for p in PIDS[1:4]])
        if err != "crash":
            wd.close()
        else:
            wd.writer_lock.release()  # the process "died": the kernel lets go of its flock
        done = _recover(root, "packed")
        assert PIDS[0] in done and (done == {PIDS[0]} or done == set(PIDS[:4]))
        wd = _open(root, "packed")
        wd.persist_groups([_group(p) for p in PIDS[1:5] if p not in done])
        wd.close()
        assert _recover(root, "packed") == set(PIDS)
        keys = [r["activation_key"] for r in iter_rows(root / layout.ACTIVATION_INDEX)]
        assert sorted(keys) == sorted(f"{p}_{s}" for p in PIDS for s in (0, 1))


def test_a_torn_batch_of_commit_markers_keeps_the_complete_ones(tmp_path):
    """The batch's prompt-index lines go down in one append; a crash part way through leaves
    the first groups' markers whole: recovery keeps those groups and cuts the rest."""
    root = tmp_path / "w"
    wd = _open(root, "packed")
    wd.persist_groups([_group(p) for p in PIDS[:3]])
    wd.close()
    index = root / layout.PROMPT_INDEX
    lines = index.read_bytes().splitlines(keepends=True)
    index.write_bytes(lines[0] + lines[1][:10])  # the second marker torn, the third never written
    assert _recover(root, "packed") == {PIDS[0]}
    for name in (layout.GENERATIONS, layout.ACTIVATION_INDEX):
        assert [r["prompt_id"] for r in iter_rows(root / name)] == [PIDS[0]] * 2
    wd = _open(root, "packed")
    wd.persist_groups([_group(p) for p in PIDS[1:3]])
    wd.close()
    assert _recover(root, "packed") == set(PIDS[:3])


def test_waiting_groups_commit_together_and_a_bad_one_fails_alone(tmp_path):
    """The groups that finish while a commit runs go down in one call; a batch that fails is
    retried one group at a time, so only the group at fault fails."""
    from hallulog.workers.group_commit import GroupCommitter

    root = tmp_path / "worker_0"
    out = _open(root, "packed")
    calls: list[list[str]] = []
    persist = out.persist_groups

    def recording(groups):
        calls.append([p["prompt_id"] for p, _ in groups])
        return persist(groups)

    out.persist_groups = recording
    committer = GroupCommitter(out)

    async def main() -> list[object]:
        await committer.commit(*_group(PIDS[0]))
        bad = _group(PIDS[1])  # its first sample reuses a key the store already holds
        bad[1][0].activation_row["activation_key"] = f"{PIDS[0]}_0"
        groups = [bad, *(_group(p) for p in PIDS[2:5])]
        return await asyncio.gather(*[committer.commit(*g) for g in groups], return_exceptions=True)

    try:
        outcomes = asyncio.run(main())
    finally:
        committer.close()
        out.close()
    assert calls[0] == [PIDS[0]]
    assert calls[1] == PIDS[1:5]  # the four waiting groups: one call
    assert calls[2:] == [[p] for p in PIDS[1:5]]  # it failed: one call per group
    assert isinstance(outcomes[0], Exception) and "already stored" in str(outcomes[0])
    assert outcomes[1:] == [None, None, None]
    assert _recover(root, "packed") == {PIDS[0], *PIDS[2:5]}


@pytest.mark.parametrize("interval", [0.0, 0.3])
def test_commits_start_at_most_once_per_interval(tmp_path, interval):
    """Groups that finish one after another within the interval share the next commit; with
    no interval each finds the committer idle and commits alone. The first group after a
    quiet spell never waits."""
    import time

    from hallulog.workers.group_commit import GroupCommitter

    out = _open(tmp_path / "worker_0", "packed")
    calls: list[tuple[float, list[str]]] = []
    persist = out.persist_groups

    def recording(groups):
        calls.append((time.monotonic(), [p["prompt_id"] for p, _ in groups]))
        return persist(groups)

    out.persist_groups = recording
    committer = GroupCommitter(out, min_interval_s=interval)

    async def main() -> float:
        start = time.monotonic()
        pending = []
        for pid in PIDS[:4]:
            pending.append(asyncio.ensure_future(committer.commit(*_group(pid))))
            await asyncio.sleep(0.05)  # each group finishes 50 ms after the one before
            if not interval:
                await pending[-1]
        await asyncio.gather(*pending)
        return start

    try:
        start = asyncio.run(main())
    finally:
        committer.close()
        out.close()
    if interval:
        assert [ids for _, ids in calls] == [PIDS[:1], PIDS[1:4]]
        assert calls[0][0] - start < 0.1  # the first group did not wait
        assert calls[1][0] - calls[0][0] >= interval - 0.01
    else:
        assert [ids for _, ids in calls] == [[p] for p in PIDS[:4]]
    assert _recover(tmp_path / "worker_0", "packed") == set(PIDS[:4])
