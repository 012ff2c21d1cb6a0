"""TF-IDF text similarity of the prompt and the primary answer (PARALLAX's text-only baseline).

``txtsim_tfidf`` = 1 - cosine of the TF-IDF vectors of what the model was asked (the rendered
prompt: the question, and the context passage when the run shows it) and its primary answer.
It reads no model internals: when a benchmark puts the answer into the prompt, a correct answer
repeats the prompt's words and the score separates the classes without detecting anything
(Hussain & Kantarcioglu, 2026). Its sentence-embedding twin, ``txtsim_embedding``, is computed
with the other embedding methods (features.py).

TF-IDF as scikit-learn's ``TfidfVectorizer`` defaults (lower case, tokens ``\\b\\w\\w+\\b``, raw
counts, smooth idf = ln((1 + N) / (1 + df)) + 1, L2-normalised rows) over the corpus of the N =
2 x prompts documents (every prompt and every answer), computed in two streaming passes over the
selfcheck export: document frequencies through a ``HashingVectorizer`` (2^20 buckets, so memory
does not grow with the vocabulary), then the scores. Equal to ``TfidfVectorizer`` wherever no
two words share a bucket (tests/evaluation/test_text_similarity.py).
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
from hallulog.evaluation.data import Run, iter_jsonl

__all__ = ["tfidf_scores", "N_FEATURES"]

N_FEATURES = 2**20


def _vectorizer():
    from sklearn.feature_extraction.text import HashingVectorizer

    return HashingVectorizer(
        n_features=N_FEATURES, alternate_sign=False, norm=None, dtype=np.float64
    )


def _pairs(run: Run, chunk: int) -> Iterator[tuple[list[str], list[str], list[str]]]:
    """(prompt ids, inputs, answers) of the labelled prompts, ``chunk`` at a time."""
    ids: list[str] = []
    inputs: list[str] = []
    answers: list[str] = []
    for _, row in iter_jsonl(run.export_path("selfcheck")):
        if row.get("label") not in (0, 1):
            continue
        ids.append(row["prompt_id"])
        inputs.append(row.get("prompt") or row.get("question") or "")
        answers.append((row.get("primary") or {}).get("text") or "")
        if len(ids) >= chunk:
            yield ids, inputs, answers
            ids, inputs, answers = [], [], []
    if ids:
        yield ids, inputs, answers


def cosine_scores(inputs: list[str], answers: list[str], idf: np.ndarray, vec) -> np.ndarray:
    """1 - cosine of the TF-IDF rows of each (input, answer) pair (0 similarity for an empty
    vector)."""
    from sklearn.preprocessing import normalize

    a = normalize(vec.transform(inputs).multiply(idf).tocsr())
    b = normalize(vec.transform(answers).multiply(idf).tocsr())
    return 1.0 - np.asarray(a.multiply(b).sum(1)).ravel()


def tfidf_scores(run: Run, *, chunk: int = 4096) -> tuple[list[str], np.ndarray]:
    """(prompt ids, ``txtsim_tfidf``) of every labelled prompt, in export order."""
    vec = _vectorizer()
    df = np.zeros(N_FEATURES, np.int64)
    n_docs = 0
    for _, inputs, answers in _pairs(run, chunk):
        x = vec.transform(inputs + answers).tocsc()
        df += np.diff(x.indptr)  # documents holding each bucket (csc: nonzeros per column)
        n_docs += x.shape[0]
    idf = np.log((1.0 + n_docs) / (1.0 + df)) + 1.0
    ids: list[str] = []
    out: list[np.ndarray] = []
    for pids, inputs, answers in _pairs(run, chunk):
        ids.extend(pids)
        out.append(cosine_scores(inputs, answers, idf, vec))
    return ids, (np.concatenate(out) if out else np.empty(0))
