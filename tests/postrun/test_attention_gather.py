"""The run's attention parts from the files its workers kept (``postrun/attention_gather.py``):
a file is taken only for the generation whose token ids it holds, from any worker directory;
a part's files go once it is committed; a second gather finds nothing to do."""

import numpy as np
from hallulog.contracts import layout
from hallulog.contracts.jsonl import encode
from hallulog.postrun.attention_gather import gather_attention
from hallulog.storage.attention_format import iter_generations
from safetensors.numpy import save_file

PROMPT = [3, 4, 5]
ANSWERS = {0: [7, 8], 1: [9, 10, 11], 2: [12]}


def _run(root):
    consolidated = layout.consolidated_dir(root)
    consolidated.mkdir(parents=True)
    (consolidated / layout.PROMPT_INDEX).write_bytes(
        encode([{"prompt_id": "p0", "prompt_token_ids": PROMPT}])
    )
    rows = [
        {"prompt_id": "p0", "sample_id": sid, "token_ids": ids, "commit_id": "c" * 32}
        for sid, ids in ANSWERS.items()
    ]
    (consolidated / layout.GENERATIONS).write_bytes(encode(rows))


def _keep(root, worker, sample_id, tokens, value):
    path = layout.worker_attention_file(layout.worker_dir(root, worker), "p0", sample_id)
    path.parent.mkdir(parents=True, exist_ok=True)
    features = np.full((len(tokens) - len(PROMPT), 2, 3, 5), value, dtype=np.float32)
    save_file({"features": features, "token_ids": np.array(tokens, dtype=np.int64)}, str(path))
    return path


def test_files_with_the_generations_tokens_become_parts(tmp_path):
    _run(tmp_path)
    kept = _keep(tmp_path, 0, 0, PROMPT + ANSWERS[0], 0.25)
    stale = _keep(tmp_path, 0, 1, PROMPT + [40, 41, 42], 0.5)  # another try's tokens
    right = _keep(tmp_path, 1, 1, PROMPT + ANSWERS[1], 0.75)
    result = gather_attention(tmp_path)
    assert (result.generations, result.tokens, result.missing) == (2, 5, 1)  # sample 2: none
    stored = {g.sample_id: g for g in iter_generations(tmp_path)}
    assert sorted(stored) == [0, 1]
    assert stored[0].features.shape == (2, 2, 3, 5) and (stored[0].features == 0.25).all()
    assert (stored[1].features == 0.75).all() and stored[1].prompt_tokens == 3
    assert stored[1].commit_id == "c" * 32
    assert not kept.exists() and not right.exists() and stale.exists()
    again = gather_attention(tmp_path)
    assert (again.generations, again.missing) == (0, 1)
