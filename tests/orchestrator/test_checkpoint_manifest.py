"""completed_prompts.json and run_manifest.json."""

import json
import threading

import pytest
from hallulog.config.manifest import build_manifest, check_resumable
from hallulog.config.run_config import RunConfig
from hallulog.contracts.errors import ArtifactError, ResumeRefused
from hallulog.orchestrator.run.checkpoint import CheckpointWriter, load_completed, write_completed


def test_checkpoint_round_trip_and_atomicity(tmp_path):
    write_completed(tmp_path, {"b", "a"}, "run-1")
    assert load_completed(tmp_path) == {"a", "b"}
    body = json.loads((tmp_path / "completed_prompts.json").read_text())
    assert body["completed"] == ["a", "b"] and body["count"] == 2 and body["run_id"] == "run-1"
    assert not list(tmp_path.glob("*.partial"))


def test_corrupt_checkpoint_names_the_file(tmp_path):
    (tmp_path / "completed_prompts.json").write_text('{"completed": [\n"a",,]}')
    with pytest.raises(ArtifactError, match=r"completed_prompts.json:2"):
        load_completed(tmp_path)


def test_background_writer_keeps_the_latest_request(tmp_path):
    writer = CheckpointWriter(tmp_path, "run")
    for i in range(50):
        writer.request({str(j) for j in range(i)})
    writer.close(final={"x", "y"})
    assert load_completed(tmp_path) == {"x", "y"}


def test_request_does_not_wait_for_a_slow_disk(tmp_path):
    from filelock import FileLock

    writer = CheckpointWriter(tmp_path, "run")
    lock = FileLock(str(tmp_path / "completed_prompts.json.lock"))
    lock.acquire()  # another holder keeps the checkpoint busy
    try:
        done = threading.Event()
        threading.Thread(target=lambda: (writer.request({"a"}), done.set())).start()
        assert done.wait(1.0), "request() blocked on the file lock"
    finally:
        lock.release()
    writer.close()
    assert load_completed(tmp_path) == {"a"}


def _manifest(**kw):
    return build_manifest(
        RunConfig(**kw),
        run_id=None,
        model_name="m",
        model_path="/m",
        layer_ids=[0, 1],
        hidden_size=4,
        num_hidden_layers=1,
        dataset="triviaqa",
        split="dev",
        prompt_template="t",
        worker_count=1,
        total_prompts=3,
    )


def test_manifest_has_seed_003_fields():
    m = _manifest()
    for key in (
        "run_id",
        "model",
        "dataset",
        "split",
        "timestamp",
        "prompt_template_hash",
        "k_samples",
        "primary_temperature",
        "sample_temperature",
        "sample_top_p",
        "max_tokens",
        "logging_profile",
        "target_layers",
        "sequence_mode",
        "storage_format",
        "dtype",
        "artifact_root",
        "activations_subdir",
        "worker_count",
        "model_revision",
        "tensor_parallel_size",
        "resumable",
        "completed_prompt_ids",
        "config_fingerprint",
        "versions",
    ):
        assert key in m, key


def test_resume_refused_on_different_config_names_the_field():
    check_resumable(_manifest(), _manifest(num_workers=4))
    with pytest.raises(ResumeRefused, match=r"k_samples: 5 -> 2"):
        check_resumable(_manifest(), _manifest(k_samples=2))
