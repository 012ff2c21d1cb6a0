"""``--shard I/N`` and ``hallulog merge``: the split, and every refusal of merge.

Shard roots here are written by the real ``WorkerDir`` (the worker's own persist code) with
small synthetic generations, so merge → consolidate → validate runs on real files in seconds.
The Slurm test (tests/deploy/test_slurm.py) does the same on shards of real runs.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from hallulog.cli.app import main
from hallulog.config.manifest import build_manifest, check_resumable, write_manifest
from hallulog.config.run_config import ConfigError, RunConfig
from hallulog.contracts import layout
from hallulog.contracts.errors import ResumeRefused
from hallulog.postrun.merge import MergeRefused, merge_shards
from hallulog.tasks import load_task
from hallulog.tasks.shards import parse_shard, shard_of
from hallulog.workers.persist import GenerationRecord, WorkerDir

K, LAYERS, HIDDEN = 1, [0, 1], 4


@pytest.mark.parametrize(
    "text, why",
    [
        ("3/2", "out of range"),
        ("2/2", "out of range"),
        ("1/0", "N must be >= 1"),
        ("a/b", "expected I/N"),
        ("1", "expected I/N"),
        ("-1/2", "expected I/N"),
    ],
)
def test_bad_shard_specs_are_one_line_errors(text, why):
    with pytest.raises(ConfigError, match=why) as info:
        RunConfig(shard=text)
    assert "--shard" in str(info.value) and "\n" not in str(info.value)


def test_shards_partition_the_limited_prompts():
    everything = [g.prompt_id for g in load_task("triviaqa", limit=9).groups]
    parts = [
        [g.prompt_id for g in load_task("triviaqa", limit=9, shard=f"{i}/3").groups]
        for i in range(3)
    ]
    assert sorted(sum(parts, [])) == sorted(everything)
    assert all(p == [x for x in everything if x in p] for p in parts)  # file order kept
    # a prompt keeps its shard when the limit grows
    assert set(parts[1]) <= {g.prompt_id for g in load_task("triviaqa", shard="1/3").groups}
    assert parse_shard(" 1/3 ") == (1, 3) and str(parse_shard("1/3")) == "1/3"
    assert all(shard_of(p, 3) == i for i, part in enumerate(parts) for p in part)


def test_shards_share_the_fingerprint_and_resume_only_as_themselves():
    a, b = _manifest(shard="0/2"), _manifest(shard="1/2")
    assert a["config_fingerprint"] == b["config_fingerprint"] and a["shard"] == "0/2"
    check_resumable(a, _manifest(shard="0/2"))
    with pytest.raises(ResumeRefused, match="shard 0/2 .* not shard 1/2"):
        check_resumable(a, b)
    with pytest.raises(ResumeRefused, match="whole run"):
        check_resumable(_manifest(), a)


def _manifest(**kw):
    config = RunConfig(**kw)
    return build_manifest(
        config,
        run_id=None,
        model_name="m",
        model_path="/m",
        layer_ids=LAYERS,
        hidden_size=HIDDEN,
        num_hidden_layers=1,
        dataset="triviaqa",
        split="dev",
        prompt_template="t",
        worker_count=1,
        total_prompts=3,
    )


def make_shard(
    root: Path,
    shard: str,
    *,
    limit: int = 6,
    skip: int = 0,
    workers: int = 2,
    fmt: str = "npy",
    **config,
) -> set[str]:
    """A finished shard root (minus its last ``skip`` prompts) written by the real WorkerDir."""
    cfg = RunConfig(
        artifact_root=root, shard=shard, limit=limit, k_samples=K, storage_format=fmt, **config
    )
    groups = load_task("triviaqa", limit=limit, shard=shard).groups
    root.mkdir(parents=True)
    m = build_manifest(
        cfg,
        run_id=None,
        model_name="m",
        model_path="/m",
        layer_ids=LAYERS,
        hidden_size=HIDDEN,
        num_hidden_layers=1,
        dataset="triviaqa",
        split="dev",
        prompt_template="t",
        worker_count=workers,
        total_prompts=len(groups),
    )
    write_manifest(root, m)
    dirs = [
        WorkerDir(
            layout.worker_dir(root, w),
            worker_id=w,
            storage_format=fmt,
            layer_ids=LAYERS,
            hidden_size=HIDDEN,
            dtype="float16",
        )
        for w in range(workers)
    ]
    written = set()
    for n, g in enumerate(groups[: len(groups) - skip]):
        wid = n % workers
        dirs[wid].persist_group(_prompt_row(g, wid), [_record(g, s, wid) for s in range(K + 1)])
        written.add(g.prompt_id)
    for d in dirs:
        d.close()
    return written


def _prompt_row(g, wid):
    return {
        "prompt_id": g.prompt_id,
        "dataset": g.dataset,
        "split": g.split,
        "dataset_id": g.dataset_id,
        "prompt": g.prompt_text,
        "label": 1,
        "label_grader": "alias_match",
        "meta": g.meta,
        "worker_id": wid,
        "completed_at": "2026-01-01T00:00:00",
    }


def _record(g, sid, wid):
    rows = 2
    row = {
        "prompt_id": g.prompt_id,
        "sample_id": sid,
        "role": "primary" if sid == 0 else "sample",
        "text": "x",
        "finish_reason": "length",
        "usage": {},
        "token_ids": [1, 2],
        "logprobs": [{"token": "x", "logprob": -0.1, "top_logprobs": []}] * 2,
        "request_params": {},
        "generation_time_ms": 1,
        "label": 1,
        "worker_id": wid,
        "activation_key": f"{g.prompt_id}_{sid}",
    }
    return GenerationRecord(
        row=row,
        acts=np.zeros((len(LAYERS), rows, HIDDEN), np.float16),
        label=1,
        prompt_rows=1,
        response_rows=1,
        activation_row={
            "prompt_id": g.prompt_id,
            "sample_id": sid,
            "activation_key": f"{g.prompt_id}_{sid}",
            "layers": LAYERS,
            "sequence_mode": "response",
            "prompt_token_count": 3,
            "response_token_count": 2,
            "row0_position": 2,
            "num_rows": rows,
        },
    )


@pytest.mark.parametrize("fmt", ["npy", "packed"])
def test_merge_gives_one_valid_run(tmp_path, fmt, capsys):
    ids = set()
    for i in range(3):
        ids |= make_shard(tmp_path / f"s{i}", f"{i}/3", fmt=fmt)
    assert ids == {g.prompt_id for g in load_task("triviaqa", limit=6).groups}
    out = tmp_path / "merged"
    summary = merge_shards(out, [tmp_path / "s2", tmp_path / "s0", tmp_path / "s1"])
    assert summary["validation"]["ok"], summary["validation"]["problems"]
    assert summary["validation"]["counts"] == {
        "prompts": 6,
        "generations": 6 * (K + 1),
        "activations": 6 * (K + 1),
    }
    manifest = json.loads((out / layout.MANIFEST).read_text())
    assert manifest["shard"] is None and manifest["config"]["shard"] is None
    # stable new names: shard order, then the shard's own worker order
    assert [
        (m["worker_dir"], m["shard"], Path(m["source"]).name) for m in manifest["merged_from"]
    ] == [(f"worker_{k}", f"{k // 2}/3", f"worker_{k % 2}") for k in range(6)]
    # hard links: nothing copied, the shard roots untouched
    a = out / "worker_0" / layout.PROMPT_INDEX
    assert a.samefile(tmp_path / "s0" / "worker_0" / layout.PROMPT_INDEX)
    # the merged root is a run like any other: `validate` and `consolidate` read its manifest
    capsys.readouterr()
    assert main(["validate", "--artifact-root", str(out)]) == 0
    assert main(["consolidate", "--artifact-root", str(out)]) == 0
    printed = capsys.readouterr()
    assert "consolidated 6 prompts" in printed.out and printed.err == ""
    # the deprecated flag of run says what to use instead, in one line, then does the same
    assert main(["run", "--artifact-root", str(out), "--validate-only"]) == 0
    err = capsys.readouterr().err.splitlines()
    assert err == [
        f"hallulog run --validate-only is deprecated: use `hallulog validate "
        f"--artifact-root {out}` (doing that now)"
    ]
    # merging again into the same --out redoes it
    assert merge_shards(out, [tmp_path / f"s{i}" for i in range(3)])["validation"]["ok"]


def test_merge_refuses_missing_overlapping_unfinished_and_different(tmp_path, capsys):
    make_shard(tmp_path / "s0", "0/2")
    make_shard(tmp_path / "s1", "1/2", skip=1)
    make_shard(tmp_path / "dup", "0/2")
    make_shard(tmp_path / "t1", "1/2", max_tokens=9)
    make_shard(tmp_path / "l1", "1/2", limit=5)
    out = tmp_path / "m"
    with pytest.raises(MergeRefused, match=r"missing shard\(s\) 1/2"):
        merge_shards(out, [tmp_path / "s0"])
    with pytest.raises(MergeRefused, match="overlapping shards: .*s0 and .*dup are all shard 0"):
        merge_shards(out, [tmp_path / "s0", tmp_path / "dup", tmp_path / "s1"])
    with pytest.raises(MergeRefused, match=r"unfinished shard 1/2 \(.*s1\): \d+ of \d+ prompts"):
        merge_shards(out, [tmp_path / "s0", tmp_path / "s1"])
    with pytest.raises(MergeRefused, match="beyond the shard: max_tokens: 64 vs 9"):
        merge_shards(out, [tmp_path / "s0", tmp_path / "t1"])
    with pytest.raises(MergeRefused, match="beyond the shard: limit: 6 vs 5"):
        merge_shards(out, [tmp_path / "s0", tmp_path / "l1"])
    with pytest.raises(MergeRefused, match="no run_manifest.json"):
        merge_shards(out, [tmp_path / "s0", tmp_path / "nothing"])
    assert not out.exists(), "a refused merge writes nothing"
    # the CLI: one line, naming the cause, exit 1
    assert main(["merge", "--out", str(out), str(tmp_path / "s0"), str(tmp_path / "s1")]) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: unfinished shard 1/2") and "\n" not in err


def test_merge_refuses_a_non_shard_and_a_foreign_out(tmp_path):
    make_shard(tmp_path / "s0", "0/1")
    plain = tmp_path / "plain"
    plain.mkdir()
    write_manifest(plain, _manifest())
    with pytest.raises(MergeRefused, match="not a shard"):
        merge_shards(tmp_path / "m", [plain])
    (tmp_path / "busy").mkdir()
    (tmp_path / "busy" / "file").write_text("x")
    with pytest.raises(MergeRefused, match="not an earlier merge"):
        merge_shards(tmp_path / "busy", [tmp_path / "s0"])


def test_merge_into_a_root_another_process_holds_is_refused_naming_it(tmp_path):
    """One writer per root: a merge into a root a live process holds (a run, another merge)
    stops with one line naming the holder, and writes nothing there."""
    import subprocess
    import sys

    from hallulog.contracts.root_lock import RootLocked

    for i in range(3):
        make_shard(tmp_path / f"s{i}", f"{i}/3")
    out = tmp_path / "merged"
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time\nfrom hallulog.contracts.root_lock import root_lock\n"
            "with root_lock(sys.argv[1], 'run'):\n    print('held', flush=True)\n"
            "    time.sleep(600)\n",
            str(out),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(RootLocked, match=f"pid {holder.pid}"):
            merge_shards(out, [tmp_path / f"s{i}" for i in range(3)])
        assert not list(layout.worker_dirs(out))
    finally:
        holder.kill()
        holder.wait()
    # the holder gone, the merge proceeds
    assert merge_shards(out, [tmp_path / f"s{i}" for i in range(3)])["validation"]["ok"]
