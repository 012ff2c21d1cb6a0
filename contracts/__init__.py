"""What the orchestrator, the workers and the servers agree on, in one place all depend on.

- :mod:`hallulog.contracts.ids`: prompt ids, activation keys, sample seeds, config fingerprints;
- :mod:`hallulog.contracts.prompt_group`: :class:`PromptGroup`, the unit of work on the queue;
- :mod:`hallulog.contracts.layout`: every path under an artifact root;
- :mod:`hallulog.contracts.jsonl`: streaming JSONL (committed-tail rule, append, rollback);
- :mod:`hallulog.contracts.run_manifest`: ``run_manifest.json`` as a frozen :class:`RunManifest`;
- :mod:`hallulog.contracts.rows`: the JSONL row types;
- :mod:`hallulog.contracts.answer_match`: the TriviaQA answer normalisation and alias match;
- :mod:`hallulog.contracts.config_cli`: a frozen config dataclass → argparse flags;
- :mod:`hallulog.contracts.errors`, :mod:`hallulog.contracts.process`.

Nothing here imports from ``orchestrator``, ``workers``, ``serving`` or ``api``.
"""

from hallulog.contracts.errors import ArtifactError, HallulogError, MalformedLineError
from hallulog.contracts.ids import activation_key, fingerprint, prompt_id_for, sample_seed
from hallulog.contracts.prompt_group import PromptGroup

__all__ = [
    "PromptGroup",
    "prompt_id_for",
    "activation_key",
    "sample_seed",
    "fingerprint",
    "HallulogError",
    "ArtifactError",
    "MalformedLineError",
]
