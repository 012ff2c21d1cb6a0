"""The field tables of docs/formats/worker-jsonl.md and consolidated-jsonl.md match what the code
writes.

A small run is built in-process with the real code and no server: ``hallulog.workers.worker.GroupWorker``
processes three prompt groups against a fake backend client (real capture files, one failed
capture, one failed group), ``WorkerDir`` persists them into a real store, ``labels.jsonl`` gets
a ``label_row``, ``consolidate`` merges, ``write_completed`` checkpoints. Every written row must
hold every field its table marks required and no field the table does not list; every listed
field must be written at least once.
"""

from __future__ import annotations

import asyncio
import json
import re
import uuid
from pathlib import Path

import numpy as np
import pytest
from hallulog.config.manifest import build_manifest, write_manifest
from hallulog.config.run_config import RunConfig
from hallulog.contracts import layout
from hallulog.contracts.jsonl import JsonlAppender, iter_rows
from hallulog.contracts.prompt_group import PromptGroup
from hallulog.contracts.rows import CONSOLIDATED_ROWS, WORKER_ROWS, RequestParams, TokenLogprob
from hallulog.orchestrator.run import checkpoint
from hallulog.postrun.consolidate import consolidate
from hallulog.postrun.labels import label_row
from hallulog.postrun.row_schemas import OPTIONAL
from hallulog.postrun.validate import SCHEMAS
from hallulog.tasks.verdict import JUDGE_GRADER, Verdict
from hallulog.workers.client import Completion, _token_logprob
from hallulog.workers.worker import GroupWorker, WorkerSpec
from safetensors.numpy import save_file

REPO = Path(__file__).resolve().parents[2]
WORKER_DOC = REPO / "docs" / "formats" / "worker-jsonl.md"
CONSOLIDATED_DOC = REPO / "docs" / "formats" / "consolidated-jsonl.md"

K = 1
LAYERS = (0, 1)
HIDDEN = 4
PROMPT_IDS, RESPONSE_IDS = [1, 2, 3], [4, 5, 6]


def tables(doc: Path) -> dict[str, dict[str, tuple[str, str, str]]]:
    """``### Table: <name>`` → {field: (type, required, meaning)} of the table that follows."""
    out: dict[str, dict[str, tuple[str, str, str]]] = {}
    name = None
    for line in doc.read_text(encoding="utf-8").splitlines():
        m = re.match(r"### Table: (.+)", line)
        if m:
            name = m.group(1).strip()
            out[name] = {}
            continue
        if line.startswith("#"):
            name = None
        if name and line.startswith("| `"):
            cells = [
                c.strip().replace("\\|", "|") for c in re.split(r"(?<!\\)\|", line.strip())[1:-1]
            ]
            assert len(cells) == 4, f"{doc.name} table {name!r}: {line!r} is not 4 columns"
            field, typ, required, meaning = cells
            assert field.startswith("`") and field.endswith("`"), line
            out[name][field.strip("`")] = (typ, required, meaning)
    return out


def fields_for(table: dict[str, tuple[str, str, str]], fmt: str) -> tuple[set[str], set[str]]:
    """(required, allowed) fields of a table for a run stored in format ``fmt`` (``packed``,
    or ``packed+positions`` for a run that stores named positions)."""
    tags = set(fmt.split("+"))
    required = {f for f, (_, r, _) in table.items() if r == "yes" or r in tags}
    allowed = {f for f, (_, r, _) in table.items() if r in ("yes", "no") or r in tags}
    return required, allowed


def check_rows(name: str, table: dict, rows: list[dict], fmt: str) -> None:
    assert rows, f"{name}: nothing written"
    required, allowed = fields_for(table, fmt)
    seen: set[str] = set()
    for i, row in enumerate(rows):
        keys = set(row)
        seen |= keys
        assert not required - keys, f"{name} row {i}: required fields missing {required - keys}"
        assert not keys - allowed, f"{name} row {i}: fields not in the doc table {keys - allowed}"
    assert not allowed - seen, f"{name}: documented fields never written {allowed - seen}"


# ---- a run built with the real code ------------------------------------------------------------

TRIVIA = PromptGroup.create(
    "triviaqa",
    "dev",
    0,
    [{"role": "user", "content": "Capital of France?"}],
    reference={"value": "Paris", "aliases": ["Paris"]},
    meta={"question_type": "capital"},
)
JUDGED = PromptGroup.create(
    "precisewikiqa", "dev", 1, [{"role": "user", "content": "Who?"}], reference="Someone", meta={}
)
BROKEN = PromptGroup.create(
    "triviaqa",
    "dev",
    2,
    [{"role": "user", "content": "Fails"}],
    reference={"value": "x", "aliases": ["x"]},
)


class FakeBackend:
    """``BackendClient`` stand-in: real capture files; TRIVIA's sample 1 gets a capture whose
    token ids disagree (capture_failed), JUDGED's sample 1 an all-zero one (capture_failed,
    reason capture_zeros), BROKEN's requests raise (generation_failed)."""

    def __init__(self, spool: Path) -> None:
        self.spool = spool
        spool.mkdir(parents=True, exist_ok=True)

    async def chat(
        self, messages, *, temperature, top_p, max_tokens, seed, capture, capture_rows="all"
    ):
        # every position is written whatever capture_rows asks: a server that ignores the field
        prompt = messages[-1]["content"]
        if prompt == BROKEN.prompt_text:
            raise RuntimeError("backend went away")
        path = self.spool / f"{uuid.uuid4().hex}.safetensors"
        captured = PROMPT_IDS + RESPONSE_IDS[:-1]  # generation capture: all but the last token
        if prompt == TRIVIA.prompt_text and temperature > 0:
            captured = [9] * len(captured)
        rng = np.random.default_rng(seed)
        hidden = rng.standard_normal((len(captured), len(LAYERS), HIDDEN)).astype(np.float32)
        if prompt == JUDGED.prompt_text and temperature > 0:
            hidden[:] = 0.0  # a backend's zeroed capture: capture_failed, reason capture_zeros
        save_file(
            {
                "hidden_states": hidden,
                "token_ids": np.array(captured, dtype=np.int64),
            },
            str(path),
        )
        entries = [
            {"token": t, "logprob": -0.5, "top_logprobs": [{"token": t, "logprob": -0.5}]}
            for t in ("Par", "is", ".")
        ]
        entries[0]["logit"] = 12.5
        return Completion(
            text="Paris.",
            finish_reason="stop",
            prompt_token_ids=list(PROMPT_IDS),
            token_ids=list(RESPONSE_IDS),
            logprobs=[_token_logprob(e) for e in entries],
            usage={"prompt_tokens": 3, "completion_tokens": 3, "total_tokens": 6},
            hidden_states_path=str(path),
            elapsed_ms=7,
        )

    async def close(self) -> None:
        pass


def _run_worker(root: Path, fmt: str, positions: tuple[str, ...] | None = None) -> None:
    spec = WorkerSpec(
        worker_id=0,
        server_url="http://127.0.0.1:1",
        model_name="fake-model",
        worker_dir=str(layout.worker_dir(root, 0)),
        storage_format=fmt,
        layer_ids=LAYERS,
        hidden_size=HIDDEN,
        sequence_mode="positions" if positions else "response",
        dtype="float16",
        capture_mode="generation",
        k_samples=K,
        primary_temperature=0.0,
        sample_temperature=0.7,
        sample_top_p=0.95,
        max_tokens=8,
        seed=0,
        groups_in_flight=1,
        request_timeout=5.0,
        positions=positions,
    )
    events: list[dict] = []

    class Channel:  # the worker's end of its pipe, recording what it sends
        def send(self, event: dict) -> None:
            events.append(event)

    async def main() -> None:
        worker = GroupWorker(spec, Channel())  # type: ignore[arg-type]
        await worker.client.close()
        worker.client = FakeBackend(layout.spool_dir(root, 0))  # type: ignore[assignment]
        try:
            for group in (TRIVIA, JUDGED, BROKEN):
                await worker._process(group)
        finally:
            worker.out.close()

    asyncio.run(main())
    done = {e["prompt_id"] for e in events if e["event"] == "done"}
    assert done == {TRIVIA.prompt_id, JUDGED.prompt_id}, events


@pytest.fixture(scope="module", params=["npy", "packed", "zarr", "packed+positions"])
def run(request, tmp_path_factory) -> tuple[Path, str]:
    fmt, _, named = request.param.partition("+")
    positions = ("tbg", "slt", "exact_answer", "last") if named else None
    root = tmp_path_factory.mktemp(f"run_{fmt}")
    config = RunConfig(
        artifact_root=root,
        k_samples=K,
        storage_format=fmt,
        positions=",".join(positions) if positions else None,
    )
    manifest = build_manifest(
        config,
        run_id=None,
        model_name="fake-model",
        model_path="fake",
        layer_ids=list(LAYERS),
        hidden_size=HIDDEN,
        num_hidden_layers=1,
        dataset="triviaqa",
        split="dev",
        prompt_template="{question}",
        worker_count=1,
        total_prompts=3,
    )
    write_manifest(root, manifest)
    _run_worker(root, fmt, positions)
    with JsonlAppender(root / layout.LABELS) as labels:
        labels.append(
            [
                label_row(
                    JUDGED.prompt_id,
                    Verdict(1, JUDGE_GRADER, "incorrect", False, "[judge] WRONG", {"steps": 1}),
                    "judge-model",
                )
            ]
        )
    consolidate(root)
    checkpoint.write_completed(root, {TRIVIA.prompt_id, JUDGED.prompt_id}, manifest["run_id"])
    return root, request.param


def rows(path: Path) -> list[dict]:
    return list(iter_rows(path))


# ---- the checks ----------------------------------------------------------------------------------


def test_every_file_of_the_layout_has_a_table():
    worker, consolidated = tables(WORKER_DOC), tables(CONSOLIDATED_DOC)
    for name in layout.WORKER_JSONL_FILES:
        assert f"worker_{{i}}/{name}" in worker
    for name in layout.CONSOLIDATED_JSONL_FILES:
        assert f"{layout.CONSOLIDATED}/{name}" in consolidated
    assert layout.LABELS in consolidated and layout.CHECKPOINT in consolidated
    assert checkpoint.CHECKPOINT_NAME == layout.CHECKPOINT


def test_validator_schemas_are_documented_as_required():
    worker, consolidated = tables(WORKER_DOC), tables(CONSOLIDATED_DOC)
    for name, schema in SCHEMAS.items():
        docs = [worker[f"worker_{{i}}/{name}"]]
        if name in layout.CONSOLIDATED_JSONL_FILES:
            docs.append(consolidated[f"{layout.CONSOLIDATED}/{name}"])
        for table in docs:
            required = {f for f, (_, r, _) in table.items() if r == "yes"}
            assert set(schema) <= required, (
                f"{name}: validated but not documented as required: {set(schema) - required}"
            )


def test_row_types_match_the_tables():
    """contracts/rows.py: a table's ``yes`` fields are the type's required keys, its other
    fields (``no`` or a format tag) the type's optional keys."""
    worker, consolidated = tables(WORKER_DOC), tables(CONSOLIDATED_DOC)
    pairs = [(f"worker_{{i}}/{n}", worker[f"worker_{{i}}/{n}"], t) for n, t in WORKER_ROWS.items()]
    pairs += [
        (key, consolidated[key], t)
        for n, t in CONSOLIDATED_ROWS.items()
        for key in [n if n == layout.LABELS else f"{layout.CONSOLIDATED}/{n}"]
    ]
    pairs += [
        ("logprobs[]", worker["logprobs[]"], TokenLogprob),
        ("request_params", worker["request_params"], RequestParams),
    ]
    for name, table, row_type in pairs:
        required = {f for f, (_, r, _) in table.items() if r == "yes"}
        assert set(row_type.__required_keys__) == required, name
        assert set(row_type.__optional_keys__) == set(table) - required, name


def test_validator_checks_only_fields_of_the_row_types():
    for name, schema in SCHEMAS.items():
        row_type = WORKER_ROWS[name]
        assert set(schema) <= row_type.__required_keys__, name
        assert (
            set(OPTIONAL.get(name, {})) <= row_type.__required_keys__ | row_type.__optional_keys__
        )


def test_worker_rows_match_the_tables(run):
    root, fmt = run
    doc = tables(WORKER_DOC)
    wdir = layout.worker_dir(root, 0)
    for name in layout.WORKER_JSONL_FILES:
        check_rows(f"worker_{{i}}/{name}", doc[f"worker_{{i}}/{name}"], rows(wdir / name), fmt)
    gens = rows(wdir / layout.GENERATIONS)
    check_rows("logprobs[]", doc["logprobs[]"], [t for g in gens for t in g["logprobs"]], fmt)
    check_rows("request_params", doc["request_params"], [g["request_params"] for g in gens], fmt)
    errors = rows(wdir / layout.ERRORS)
    assert {e["error_type"] for e in errors} == {"capture_failed", "generation_failed"}


def test_commit_ids_tie_a_group_together(run):
    root, _ = run
    wdir = layout.worker_dir(root, 0)
    prompts = {r["prompt_id"]: r["commit_id"] for r in rows(wdir / layout.PROMPT_INDEX)}
    for name in (layout.GENERATIONS, layout.ACTIVATION_INDEX):
        for r in rows(wdir / name):
            assert r["commit_id"] == prompts[r["prompt_id"]]


def test_consolidated_rows_match_the_tables(run):
    root, fmt = run
    doc = tables(CONSOLIDATED_DOC)
    out = layout.consolidated_dir(root)
    for name in layout.CONSOLIDATED_JSONL_FILES:
        key = f"{layout.CONSOLIDATED}/{name}"
        check_rows(key, doc[key], rows(out / name), fmt)


def test_labels_and_checkpoint_match_the_tables(run):
    root, fmt = run
    doc = tables(CONSOLIDATED_DOC)
    check_rows(layout.LABELS, doc[layout.LABELS], rows(root / layout.LABELS), fmt)
    body = json.loads((root / layout.CHECKPOINT).read_text(encoding="utf-8"))
    check_rows(layout.CHECKPOINT, doc[layout.CHECKPOINT], [body], fmt)
