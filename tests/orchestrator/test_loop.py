"""The run loop's drive (hallulog.orchestrator.run.dispatch) over a pool of fake workers, the
completion log and snapshot, and the worker-count rules of the config."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hallulog.backends.models import ModelInfo
from hallulog.config.plan import plan_run, plan_task
from hallulog.config.run_config import ConfigError, RunConfig
from hallulog.contracts.errors import HallulogError
from hallulog.orchestrator.run.checkpoint import (
    CheckpointWriter,
    CompletionLog,
    load_completed,
    read_completion_log,
    write_completed,
)
from hallulog.orchestrator.run.dispatch import Drive
from hallulog.orchestrator.run.loop import RunResult, _pending_groups, _reconcile
from hallulog.orchestrator.run.pool import WorkerPool
from hallulog.orchestrator.run.progress import Progress
from hallulog.orchestrator.run.status import StatusBoard

from tests.orchestrator.fake_worker import FakeSpec, committed, fake_worker
from tests.orchestrator.test_pool import _groups


def _drive(tmp_path: Path, urls: list[str], groups, *, max_restarts=5, **config) -> Drive:
    specs = [FakeSpec(i, url, str(tmp_path / f"worker_{i}")) for i, url in enumerate(urls)]
    pool = WorkerPool(
        specs,
        committed_in=lambda wid: set(committed(specs[wid].worker_dir)),
        target=fake_worker,
        max_restarts=max_restarts,
    )
    pool.submit(groups)
    pool.start()
    board = StatusBoard(
        run_id="r",
        config_summary={},
        fingerprint="f",
        artifact_root=str(tmp_path),
        total_prompts=len(groups),
    )
    return Drive(
        pool=pool,
        config=RunConfig(artifact_root=tmp_path, k_samples=2, **config),
        board=board,
        progress=Progress(len(groups), enabled=False),
        completions=CompletionLog(tmp_path),
        snapshots=CheckpointWriter(tmp_path, "r"),
        completed=set(),
        result=RunResult(tmp_path, total=len(groups), done_before=0),
        tick_seconds=0.1,
    )


def _finish(drive: Drive) -> None:
    drive.pool.close()
    drive.snapshots.close()
    drive.completions.close()


def test_drive_completes_logs_every_id_once_and_snapshots_on_its_interval(tmp_path):
    groups = _groups(30, sleep=0.05)
    drive = _drive(tmp_path, ["fake://fast", "fake://fast"], groups, checkpoint_interval=0.2)
    try:
        drive.run()
    finally:
        _finish(drive)
    ids = {g.prompt_id for g in groups}
    assert drive.completed == ids and drive.result.done == 30
    lines = (tmp_path / "completions.log").read_text().split()
    assert sorted(lines) == sorted(ids)
    assert read_completion_log(tmp_path) == ids
    # a snapshot was written during the run (interval), and the last one is exact
    assert 0 < len(load_completed(tmp_path)) <= 30
    snap = drive.board.snapshot()
    assert snap["prompts"]["done"] == 30 and snap["prompts"]["in_flight"] == 0


def test_drive_fails_with_the_reason_when_no_worker_is_left(tmp_path):
    drive = _drive(tmp_path, ["fake://doomed"], _groups(3), max_restarts=1)
    try:
        with pytest.raises(HallulogError, match=r"no worker is left .* worker 0: died 2 times"):
            drive.run()
    finally:
        _finish(drive)


def test_failed_groups_are_reported_not_logged_as_complete(tmp_path):
    groups = _groups(3, fail=True)
    drive = _drive(tmp_path, ["fake://fast"], groups)
    try:
        drive.run()
    finally:
        _finish(drive)
    assert sorted(drive.result.failed) == sorted(g.prompt_id for g in groups)
    assert read_completion_log(tmp_path) == set()


def test_completion_log_ignores_a_torn_tail_and_appends_after_it(tmp_path):
    (tmp_path / "completions.log").write_bytes(b"aaaa\nbbbb\ncc")
    assert read_completion_log(tmp_path) == {"aaaa", "bbbb"}
    log = CompletionLog(tmp_path)
    log.append(["dddd", "eeee"])
    assert read_completion_log(tmp_path) == {"aaaa", "bbbb", "dddd", "eeee"}
    log.reset()
    log.append(["ffff"])
    log.close()
    assert (tmp_path / "completions.log").read_text() == "ffff\n"


def test_reconcile_reads_log_and_snapshot_but_the_data_wins(tmp_path, caplog):
    write_completed(tmp_path, {"a"}, "r")
    (tmp_path / "completions.log").write_text("b\n")
    model = ModelInfo(path=tmp_path / "model", num_hidden_layers=1, hidden_size=8, name="m")
    plan = plan_run(RunConfig(artifact_root=tmp_path), model)
    assert _reconcile(tmp_path, plan, "r") == set()  # no worker data at all
    assert "the checkpoint lists 2 prompt(s), the worker data 0" in caplog.text
    assert load_completed(tmp_path) == set()
    assert read_completion_log(tmp_path) == set()
    assert json.loads((tmp_path / "completed_prompts.json").read_text())["count"] == 0


def test_workers_default_to_one_per_server_and_fewer_are_refused():
    assert RunConfig().worker_count == 1
    assert RunConfig(gpus=(0, 1, 2, 3)).worker_count == 4
    assert RunConfig(manage_servers=False, server_urls=("http://a", "http://b")).worker_count == 2
    assert RunConfig(gpus=(0, 1), num_workers=5).worker_count == 5
    with pytest.raises(ConfigError, match=r"--num-workers 1 leaves servers without a worker"):
        RunConfig(gpus=(0, 1, 2, 3), num_workers=1)
    with pytest.raises(ConfigError, match=r"--num-workers"):
        RunConfig(manage_servers=False, server_urls=("http://a", "http://b"), num_workers=1)


class _RetiredFleet:
    def poll(self, stalled=()):
        pass

    def progressed(self, url):
        pass

    def all_retired(self):
        return True

    def recovering(self):
        return False

    def retired_reasons(self):
        return "server_0 (http://x): exited with code -9; failed 4 time(s) in a row"


def test_run_fails_naming_the_reasons_when_every_server_is_retired(tmp_path):
    drive = _drive(tmp_path, ["fake://fast"], _groups(2))
    drive.pool.retire_workers([0], "server retired")
    drive.fleet = _RetiredFleet()
    try:
        with pytest.raises(
            HallulogError,
            match=r"every server is retired.*2 remaining.*"
            r"server_0 \(http://x\): exited with code -9",
        ):
            drive.run()
    finally:
        _finish(drive)


def test_the_task_is_read_twice_and_a_changed_file_is_refused(tmp_path):
    path = tmp_path / "qa.jsonl"
    row = '{"QuestionId": "%s", "Question": "Q %s?", "Answer": {"Value": "a", "Aliases": ["a"]}}\n'
    path.write_text("".join(row % (i, i) for i in range(6)))
    task = plan_task(RunConfig(artifact_root=tmp_path / "run", task_path=str(path)))
    stream, ids = task.stream, set(task.prompt_ids)
    assert len(ids) == 6 and task.split == "dev"
    done = set(sorted(ids)[:4])
    todo = [g.prompt_id for g in _pending_groups(stream, ids, lambda pid: pid not in done)]
    assert sorted(todo) == sorted(ids - done)
    with path.open("a") as f:
        f.write(row % ("new", "new"))
    with pytest.raises(HallulogError, match="qa.jsonl changed during the run"):
        list(_pending_groups(stream, ids, lambda pid: pid not in done))
