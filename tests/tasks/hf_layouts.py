"""Each preset's bundled sample rewritten in the layout its Hugging Face dataset has today: the
same records, the hub's column names, types and nesting (``datasets.Features``), written as a
Parquet file (``Dataset.to_parquet``, what the hub's ``data/*.parquet`` files are) and as a
``save_to_disk`` directory.

The datasets and configs (their features looked up on the hub's dataset cards):
``mandarjoshi/trivia_qa`` rc.nocontext (``answer`` a struct with ``aliases`` …),
``google-research-datasets/nq_open``, ``rajpurkar/squad_v2`` (``answers`` a struct of lists),
``hotpotqa/hotpot_qa`` distractor (``context`` a struct of ``title`` and ``sentences`` lists),
``akariasai/PopQA`` (int64 ids, ``possible_answers`` a JSON text), ``truthfulqa/truthful_qa``
generation (snake_case, answer lists), ``allenai/sciq``, ``cais/mmlu`` (``choices`` list,
``answer`` a ClassLabel int), ``openai/gsm8k`` main, ``ChilleD/SVAMP`` (float64 ``Answer``);
BioASQ has no official hub copy (the set needs registration): its exports keep the released
field names.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from hallulog.tasks.base import MalformedCollector
from hallulog.tasks.records import iter_records

__all__ = ["HF_DATASETS", "hf_rows", "write_layouts"]

HF_DATASETS = {
    "triviaqa": "mandarjoshi/trivia_qa rc.nocontext",
    "nq_open": "google-research-datasets/nq_open",
    "squad": "rajpurkar/squad_v2",
    "hotpotqa": "hotpotqa/hotpot_qa distractor",
    "popqa": "akariasai/PopQA",
    "truthfulqa": "truthfulqa/truthful_qa generation",
    "sciq": "allenai/sciq",
    "mmlu": "cais/mmlu",
    "gsm8k": "openai/gsm8k main",
    "svamp": "ChilleD/SVAMP",
    "bioasq": "BioASQ training JSON fields (community exports)",
}


def _released(name: str) -> list[dict[str, Any]]:
    from hallulog.tasks import bundled_path

    path = bundled_path(name)
    collector = MalformedCollector(str(path), strict=True)
    if name == "triviaqa":
        return json.loads(path.read_text())["Data"]
    if name == "squad":
        from hallulog.tasks.presets.open_domain import squad_records

        return [
            at.record
            for at in squad_records(
                path, split=None, collector=collector, fmt="auto", records_key=None
            )
        ]
    if name == "mmlu":
        from hallulog.tasks.presets.closed_form import mmlu_records

        return [
            at.record
            for at in mmlu_records(
                path, split=None, collector=collector, fmt="auto", records_key=None
            )
        ]
    return [at.record for at in iter_records(path, collector=collector)]


def hf_rows(name: str) -> tuple[list[dict[str, Any]], Any]:
    """The bundled sample of preset ``name`` as the hub's rows, and their ``datasets.Features``."""
    from datasets import ClassLabel, Features, Sequence, Value

    s = Value("string")
    recs = _released(name)
    if name == "triviaqa":
        features = Features(
            {
                "question": s,
                "question_id": s,
                "question_source": s,
                "entity_pages": Sequence(
                    {"doc_source": s, "filename": s, "title": s, "wiki_context": s}
                ),
                "search_results": Sequence(
                    {
                        "description": s,
                        "filename": s,
                        "rank": Value("int32"),
                        "title": s,
                        "url": s,
                        "search_context": s,
                    }
                ),
                "answer": {
                    "aliases": Sequence(s),
                    "normalized_aliases": Sequence(s),
                    "matched_wiki_entity_name": s,
                    "normalized_matched_wiki_entity_name": s,
                    "normalized_value": s,
                    "type": s,
                    "value": s,
                },
            }
        )
        rows = []
        for r in recs:
            a = r["Answer"]
            rows.append(
                {
                    "question": r["Question"],
                    "question_id": r["QuestionId"],
                    "question_source": r.get("QuestionSource", ""),
                    "entity_pages": {
                        k: [] for k in ("doc_source", "filename", "title", "wiki_context")
                    },
                    "search_results": {
                        k: []
                        for k in (
                            "description",
                            "filename",
                            "rank",
                            "title",
                            "url",
                            "search_context",
                        )
                    },
                    "answer": {
                        "aliases": a["Aliases"],
                        "normalized_aliases": a["NormalizedAliases"],
                        "matched_wiki_entity_name": a.get("MatchedWikiEntityName", ""),
                        "normalized_matched_wiki_entity_name": a.get(
                            "NormalizedMatchedWikiEntityName", ""
                        ),
                        "normalized_value": a["NormalizedValue"],
                        "type": a["Type"],
                        "value": a["Value"],
                    },
                }
            )
        return rows, features
    if name == "nq_open":
        return (
            [{"question": r["question"], "answer": r["answer"]} for r in recs],
            Features({"question": s, "answer": Sequence(s)}),
        )
    if name == "squad":
        features = Features(
            {
                "id": s,
                "title": s,
                "context": s,
                "question": s,
                "answers": Sequence({"text": s, "answer_start": Value("int32")}),
            }
        )
        rows = [
            {
                "id": r["id"],
                "title": r["title"],
                "context": r["context"],
                "question": r["question"],
                "answers": {
                    "text": [] if r.get("is_impossible") else [a["text"] for a in r["answers"]],
                    "answer_start": []
                    if r.get("is_impossible")
                    else [a["answer_start"] for a in r["answers"]],
                },
            }
            for r in recs
        ]
        return rows, features
    if name == "hotpotqa":
        features = Features(
            {
                "id": s,
                "question": s,
                "answer": s,
                "type": s,
                "level": s,
                "supporting_facts": Sequence({"title": s, "sent_id": Value("int32")}),
                "context": Sequence({"title": s, "sentences": Sequence(s)}),
            }
        )
        rows = [
            {
                "id": r["_id"],
                "question": r["question"],
                "answer": r["answer"],
                "type": r["type"],
                "level": r["level"],
                "supporting_facts": {
                    "title": [f[0] for f in r["supporting_facts"]],
                    "sent_id": [f[1] for f in r["supporting_facts"]],
                },
                "context": {
                    "title": [c[0] for c in r["context"]],
                    "sentences": [c[1] for c in r["context"]],
                },
            }
            for r in recs
        ]
        return rows, features
    if name == "popqa":
        ints = ("id", "subj_id", "prop_id", "obj_id", "s_pop", "o_pop")
        features = Features({k: Value("int64") if k in ints else s for k in recs[0]})
        return [{k: int(v) if k in ints else v for k, v in r.items()} for r in recs], features
    if name == "truthfulqa":
        features = Features(
            {
                "type": s,
                "category": s,
                "question": s,
                "best_answer": s,
                "correct_answers": Sequence(s),
                "incorrect_answers": Sequence(s),
                "source": s,
            }
        )
        rows = [
            {
                "type": r["Type"],
                "category": r["Category"],
                "question": r["Question"],
                "best_answer": r["Best Answer"],
                "correct_answers": [x.strip() for x in r["Correct Answers"].split(";")],
                "incorrect_answers": [x.strip() for x in r["Incorrect Answers"].split(";")],
                "source": r["Source"],
            }
            for r in recs
        ]
        return rows, features
    if name == "sciq":
        keys = (
            "question",
            "distractor3",
            "distractor1",
            "distractor2",
            "correct_answer",
            "support",
        )
        return [{k: r[k] for k in keys} for r in recs], Features({k: s for k in keys})
    if name == "mmlu":
        features = Features(
            {
                "question": s,
                "subject": s,
                "choices": Sequence(s),
                "answer": ClassLabel(names=["A", "B", "C", "D"]),
            }
        )
        rows = [
            {
                "question": r["question"],
                "subject": r["subject"],
                "choices": [r[c] for c in "ABCD"],
                "answer": "ABCD".index(r["answer"]),
            }
            for r in recs
        ]
        return rows, features
    if name == "gsm8k":
        return (
            [{"question": r["question"], "answer": r["answer"]} for r in recs],
            Features({"question": s, "answer": s}),
        )
    if name == "svamp":
        features = Features(
            {
                "ID": s,
                "Body": s,
                "Question": s,
                "Equation": s,
                "Answer": Value("float64"),
                "Type": s,
                "question_concat": s,
            }
        )
        rows = [
            {
                "ID": r["ID"],
                "Body": r["Body"],
                "Question": r["Question"],
                "Equation": r["Equation"],
                "Answer": float(r["Answer"]),
                "Type": r["Type"],
                "question_concat": f"{r['Body']} {r['Question']}",
            }
            for r in recs
        ]
        return rows, features
    if name == "bioasq":
        snippet = {
            "document": s,
            "text": s,
            "offsetInBeginSection": Value("int64"),
            "offsetInEndSection": Value("int64"),
            "beginSection": s,
            "endSection": s,
        }
        features = Features(
            {
                "id": s,
                "type": s,
                "body": s,
                "documents": Sequence(s),
                "ideal_answer": Sequence(s),
                "exact_answer": Sequence(Sequence(s)),
                "snippets": [snippet],
            }
        )
        rows = []
        for r in recs:
            exact = r.get("exact_answer")
            if isinstance(exact, str):
                exact = [[exact]]
            elif exact is None:
                exact = []
            else:
                exact = [e if isinstance(e, list) else [e] for e in exact]
            rows.append(
                {
                    "id": r["id"],
                    "type": r["type"],
                    "body": r["body"],
                    "documents": r.get("documents", []),
                    "ideal_answer": r.get("ideal_answer", []),
                    "exact_answer": exact,
                    "snippets": r.get("snippets", []),
                }
            )
        return rows, features
    raise KeyError(name)


def write_layouts(name: str, out: Path) -> dict[str, Path]:
    """``{"parquet": <file>, "hf": <save_to_disk dir>}`` of preset ``name``'s sample."""
    from datasets import Dataset

    rows, features = hf_rows(name)
    ds = Dataset.from_list(rows, features=features)
    out.mkdir(parents=True, exist_ok=True)
    parquet = out / f"{name}-00000-of-00001.parquet"
    ds.to_parquet(str(parquet))
    disk = out / f"{name}_saved"
    ds.save_to_disk(str(disk))
    return {"parquet": parquet, "hf": disk}
